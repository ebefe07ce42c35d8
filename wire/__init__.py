"""Wire codec."""
