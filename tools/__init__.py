"""Lamina tools: the CLI, offline inspection, the Spark data source."""
