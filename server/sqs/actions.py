"""SQS queue actions (everything but the message actions of ``messaging.py``) and the table
of every action by name.

A queue's SQS-only attributes and its tags live in the queue's extras (``engine/extras.py``);
actions that change a queue and its extras run as one engine job, in one group commit.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Awaitable, Callable

from lamina.engine.errors import InvalidArgument, InvalidRedrivePolicy, QueueNotFound

from .context import Context
from .errors import SqsError, invalid, missing
from .messaging import MESSAGE_ACTIONS, int_param, queue_of
from .queues import (
    FIFO_SUFFIX,
    SHARED_ATTRIBUTES,
    QueueRef,
    answer_attributes,
    check_attribute_names,
    check_requested_names,
    extras_of,
    lamina_attributes,
    ref_of_name,
    sqs_name_of,
)

__all__ = ["ACTIONS", "Action"]

Action = Callable[[Context, dict[str, Any]], Awaitable[dict[str, Any]]]

MAX_TAGS = 50
MAX_LAMINA_NAME = 64
REDRIVE_BATCH = 100_000


def _now_s() -> int:
    return int(time.time())


def _dlq_name(ref: QueueRef) -> str:
    return ref.lamina_name


def _check_dead_letter_queue(engine: Any, caller: str | None, ref: QueueRef, naming: Any,
                             redrive: dict[str, Any] | None) -> None:
    """SQS's rules for the dead-letter queue ``ref``'s RedrivePolicy names: it exists, it is of
    the same kind (FIFO or standard), and its RedriveAllowPolicy lets ``ref`` use it."""
    if not redrive:
        return
    try:
        extras = engine.queue_extras(redrive["dlq"], caller=caller)
    except QueueNotFound:
        raise invalid("Value for parameter RedrivePolicy is invalid. Reason: Dead letter "
                      "target does not exist.") from None
    if sqs_name_of(redrive["dlq"]).endswith(FIFO_SUFFIX) != ref.fifo:
        raise invalid("Value for parameter RedrivePolicy is invalid. Reason: the dead-letter "
                      "queue of a FIFO queue must be a FIFO queue, and of a standard queue a "
                      "standard queue.")
    raw = extras.get("RedriveAllowPolicy")
    if not raw:
        return
    policy = json.loads(raw)
    permission = policy.get("redrivePermission")
    if permission == "denyAll" or (permission == "byQueue" and naming.arn(ref.sqs_name) not in
                                   policy.get("sourceQueueArns", [])):
        raise invalid("Value for parameter RedrivePolicy is invalid. Reason: the "
                      "dead-letter queue's RedriveAllowPolicy does not allow this queue.")


#: Lamina's queue attribute names (in its refusals) -> SQS's.
_SQS_NAMES = {"redrive.dlq": "RedrivePolicy", "redrive": "RedrivePolicy",
              **{lamina: sqs for sqs, (lamina, *_) in SHARED_ATTRIBUTES.items()}}
_LAMINA_NAME_RE = re.compile(r"\b(?:attributes\.)(?:%s)\b|\b(?:%s)\b" % (
    "|".join(re.escape(name) for name in _SQS_NAMES),
    "|".join(lamina for lamina, *_ in SHARED_ATTRIBUTES.values())))


def _attribute_error(error: InvalidArgument | InvalidRedrivePolicy) -> SqsError:
    """A Lamina refusal of queue attributes, in SQS's attribute names."""
    message = _LAMINA_NAME_RE.sub(
        lambda match: _SQS_NAMES[match.group().removeprefix("attributes.")], error.message)
    code = ("InvalidParameterValue" if isinstance(error, InvalidRedrivePolicy)
            else "InvalidAttributeValue")
    return SqsError(code, message)


def _tags_param(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid(f"{name} must be a map of strings.")
    for key, item in value.items():
        if not 1 <= len(key) <= 128 or len(item) > 256:
            raise invalid(f"{name}: tag keys are 1-128 characters, values at most 256.")
    return value


async def create_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = params.get("QueueName")
    if name is None:
        raise missing("QueueName")
    ref = ref_of_name(name)
    attributes = check_attribute_names(params.get("Attributes"), ref.fifo, creating=True)
    tags = _tags_param(params.get("tags", params.get("Tags")), "tags")
    if len(tags) > MAX_TAGS:
        raise invalid(f"Too many tags: at most {MAX_TAGS}.")
    naming = ctx.naming
    given = lamina_attributes(attributes, naming, False, _dlq_name)
    lamina = lamina_attributes(attributes, naming, True, _dlq_name)  # with SQS's defaults
    new_extras = extras_of(attributes, ref.fifo, None, _now_s())
    new_extras.pop("LastModifiedTimestamp", None)

    def run(engine: Any, caller: str | None) -> None:
        try:
            current = engine.queue_attributes(ref.lamina_name)
        except QueueNotFound:
            current = None
        if current is not None:  # SQS: the same name with no different attribute: its URL
            existing = engine.check_queue_access(ref.lamina_name, caller=caller)
            if existing != ref.lamina_name:
                raise SqsError("QueueNameExists", f"The queue {sqs_name_of(existing)!r} "
                               "exists: queue names that differ only in letter case are one "
                               "queue here.")
            old = engine.queue_extras(ref.lamina_name)
            if any(current.get(k) != v for k, v in given.items()) or any(
                    old.get(k) != v for k, v in new_extras.items()):
                raise SqsError("QueueNameExists", "A queue already exists with the same "
                               "name and a different value for an attribute.")
            return
        _check_dead_letter_queue(engine, caller, ref, naming, lamina.get("redrive"))
        extras = dict(new_extras)
        if tags:
            extras["tags"] = tags
        try:  # the queue and its extras in one write: never a queue without them
            engine.create_queue(ref.lamina_name, lamina, extras=extras or None, caller=caller)
        except (InvalidArgument, InvalidRedrivePolicy) as exc:
            raise _attribute_error(exc) from None

    await ctx.bridge.job(run)
    return {"QueueUrl": ctx.url(ref.sqs_name)}


async def get_queue_url(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    name = params.get("QueueName")
    if name is None:
        raise missing("QueueName")
    owner = params.get("QueueOwnerAWSAccountId")
    if owner is not None and owner != ctx.naming.account:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    ref = ref_of_name(name, lookup=True)
    await ctx.bridge.job(lambda engine, caller: engine.check_queue_access(ref.lamina_name,
                                                                          caller=caller))
    return {"QueueUrl": ctx.url(ref.sqs_name)}


async def list_queues(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    prefix = params.get("QueueNamePrefix")
    if prefix is not None and (not isinstance(prefix, str) or len(prefix) > 80):
        raise invalid("QueueNamePrefix is a string of at most 80 characters.")
    limit = int_param(params, "MaxResults", 1, 1000)
    token = params.get("NextToken")
    if token is not None and not isinstance(token, str):
        raise invalid("NextToken is a string.")
    names, after = await _queue_names(ctx, prefix, token or None, limit or 1000)
    result: dict[str, Any] = {"QueueUrls": [ctx.url(name) for name in names]}
    if limit is not None and after is not None:
        result["NextToken"] = after
    return result


async def _queue_names(ctx: Context, prefix: str | None, after: str | None, wanted: int
                       ) -> tuple[list[str], str | None]:
    """-> (up to ``wanted`` SQS names starting with ``prefix`` after ``after``, the next
    page's ``after`` or None). Lamina lists its own names, letter case aside ("a.fifo" is
    "a-fifo"): its pages are filtered down to the names SQS's case-sensitive prefix takes."""
    lamina_prefix = prefix.replace(".", "-") if prefix else None
    if lamina_prefix is not None and len(lamina_prefix) > MAX_LAMINA_NAME:
        return [], None  # no queue's name is that long
    names: list[str] = []
    while True:
        args: dict[str, Any] = {"limit": wanted - len(names)}
        if lamina_prefix:
            args["prefix"] = lamina_prefix
        if after is not None:
            args["after"] = after
        page = (await ctx.bridge.call("list_queues", args)).result
        names.extend(name for name in map(sqs_name_of, page["queues"])
                     if not prefix or name.startswith(prefix))
        after = page["next"]
        if after is None or len(names) == wanted:
            return names, after


async def delete_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    await ctx.bridge.call("delete_queue", {"queue": ref.lamina_name})
    return {}


async def purge_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    await ctx.bridge.job(lambda engine, caller: engine.check_queue_access(ref.lamina_name,
                                                                          caller=caller))
    if not ctx.state.purge_allowed(ref.lamina_name):
        raise SqsError("PurgeQueueInProgress", "Only one PurgeQueue operation on "
                       f"{ref.sqs_name} is allowed every 60 seconds.")
    await ctx.bridge.call("purge_queue", {"queue": ref.lamina_name})
    return {}


async def get_queue_attributes(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    names = check_requested_names(params.get("AttributeNames"))
    if not names:
        return {}

    counts = "All" in names or any(name.startswith("Approximate") for name in names)

    def run(engine: Any, caller: str | None) -> tuple[Any, dict[str, Any]]:
        info = (engine.get_queue if counts else engine.queue_summary)(ref.lamina_name,
                                                                      caller=caller)
        return info, engine.queue_extras(ref.lamina_name, caller=caller)

    info, extras = await ctx.bridge.job(run)
    answer = answer_attributes(names, info.attributes, extras, info.created, info.stats,
                               ref.sqs_name, ctx.naming, sqs_name_of)
    return {"Attributes": answer} if answer else {}


async def set_queue_attributes(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    if params.get("Attributes") is None:
        raise missing("Attributes")
    attributes = check_attribute_names(params["Attributes"], ref.fifo, creating=False)
    naming = ctx.naming
    lamina = lamina_attributes(attributes, naming, False, _dlq_name)

    def run(engine: Any, caller: str | None) -> None:
        engine.check_queue_access(ref.lamina_name, caller=caller)
        old = engine.queue_extras(ref.lamina_name)  # the changes below check "manage"
        extras = extras_of(attributes, ref.fifo, old, _now_s())
        if "redrive" in lamina:
            _check_dead_letter_queue(engine, caller, ref, naming, lamina["redrive"])
        if lamina:  # with the extras in one write: all of it changes, or nothing
            try:
                engine.set_queue_attributes(ref.lamina_name, lamina, caller=caller,
                                            extras=extras if extras != old else None)
            except (InvalidArgument, InvalidRedrivePolicy) as exc:
                raise _attribute_error(exc) from None
        elif extras != old:
            engine.set_queue_extras(ref.lamina_name, extras, caller=caller)

    await ctx.bridge.job(run)
    return {}


# -- tags ---------------------------------------------------------------------------------------


async def _change_tags(ctx: Context, ref: QueueRef, change: Callable[[dict[str, str]], None]
                       ) -> None:
    def run(engine: Any, caller: str | None) -> None:
        extras = engine.queue_extras(ref.lamina_name)  # set_queue_extras checks "manage"
        tags = dict(extras.get("tags", {}))
        change(tags)
        if len(tags) > MAX_TAGS:
            raise invalid(f"Too many tags: a queue has at most {MAX_TAGS}.")
        if tags:
            extras["tags"] = tags
        else:
            extras.pop("tags", None)
        engine.set_queue_extras(ref.lamina_name, extras, caller=caller)

    await ctx.bridge.job(run)


async def tag_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    if params.get("Tags") is None:
        raise missing("Tags")
    new = _tags_param(params["Tags"], "Tags")
    await _change_tags(ctx, ref, lambda tags: tags.update(new))
    return {}


async def untag_queue(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    keys = params.get("TagKeys")
    if keys is None:
        raise missing("TagKeys")
    if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
        raise invalid("TagKeys must be a list of strings.")

    def remove(tags: dict[str, str]) -> None:
        for key in keys:
            tags.pop(key, None)

    await _change_tags(ctx, ref, remove)
    return {}


async def list_queue_tags(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    extras = await ctx.bridge.job(lambda engine, caller: engine.queue_extras(
        ref.lamina_name, caller=caller))
    tags = extras.get("tags")
    return {"Tags": dict(tags)} if tags else {}


# -- dead-letter queues and move tasks -------------------------------------------------------


def _sources_of(engine: Any, caller: str | None, dlq: str) -> list[str]:
    """The queues (``caller`` may see) whose redrive policy names ``dlq``, in name order."""
    sources, after = [], None
    while True:
        page = engine.list_queues(after=after, limit=1000, caller=caller)
        for name in page.queues:
            redrive = engine.queue_attributes(name).get("redrive")
            if redrive and redrive["dlq"].lower() == dlq.lower():
                sources.append(name)
        if page.next is None:
            return sources
        after = page.next


async def list_dead_letter_source_queues(ctx: Context, params: dict[str, Any]
                                         ) -> dict[str, Any]:
    ref = queue_of(ctx, params)
    limit = int_param(params, "MaxResults", 1, 1000)
    token = params.get("NextToken")
    if token is not None and not isinstance(token, str):
        raise invalid("NextToken is a string.")

    def run(engine: Any, caller: str | None) -> list[str]:
        engine.queue_extras(ref.lamina_name, caller=caller)  # exists, may be read
        return _sources_of(engine, caller, ref.lamina_name)

    sources = [name for name in await ctx.bridge.job(run)
               if token is None or name.lower() > token.lower()]
    page = sources[:limit or 1000]  # without MaxResults SQS answers at most 1000
    result: dict[str, Any] = {"queueUrls": [ctx.url(sqs_name_of(name)) for name in page]}
    if limit is not None and len(sources) > limit:
        result["NextToken"] = page[-1]
    return result


def _no_such_queue(field: str) -> SqsError:
    """SQS's answer to a move task naming a queue that does not exist."""
    return SqsError("ResourceNotFoundException", "The resource that you specified for the "
                    f"{field} parameter doesn't exist.")


def _move_task_queue(naming: Any, arn: Any, field: str) -> QueueRef:
    try:
        return naming.ref_of_arn(arn, field)
    except SqsError as exc:
        if exc.code == "QueueDoesNotExist":
            raise _no_such_queue(field) from None
        raise


def _existing(field: str, lookup: Callable[[], Any]) -> Any:
    """``lookup()`` of the queue ``field`` names; a queue that does not exist is SQS's
    ResourceNotFoundException here."""
    try:
        return lookup()
    except QueueNotFound:
        raise _no_such_queue(field) from None


async def start_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source_arn = params.get("SourceArn")
    if source_arn is None:
        raise missing("SourceArn")
    naming = ctx.naming
    dlq = _move_task_queue(naming, source_arn, "SourceArn")
    destination_arn = params.get("DestinationArn")
    destination = (_move_task_queue(naming, destination_arn, "DestinationArn")
                   if destination_arn is not None else None)
    rate = int_param(params, "MaxNumberOfMessagesPerSecond", 1, 500)

    def sources_of_dlq(engine: Any, caller: str | None) -> list[str]:
        _existing("SourceArn", lambda: engine.check_queue_access(dlq.lamina_name,
                                                                 caller=caller))
        if destination is not None:
            _existing("DestinationArn", lambda: engine.check_queue_access(
                destination.lamina_name, caller=caller))
        return _sources_of(engine, None, dlq.lamina_name)  # the redrive checks "manage"

    sources = await ctx.bridge.job(sources_of_dlq)
    if not sources:
        raise invalid("Source queue must be configured as a Dead Letter Queue: no queue's "
                      "RedrivePolicy names it.")
    if destination is not None and destination.lamina_name.lower() not in {
            name.lower() for name in sources}:
        raise invalid("DestinationArn: dead letters go back to the queue they came from; "
                      "this queue does not use the source queue as its dead-letter queue.")
    started = int(time.time() * 1000)
    moved = 0
    while True:
        args: dict[str, Any] = {"queue": dlq.lamina_name, "max": REDRIVE_BATCH}
        if destination is not None:
            args["source"] = destination.lamina_name
        done = (await ctx.bridge.call("redrive", args)).result
        moved += done["moved"]
        if done["moved"] + done["skipped"] < REDRIVE_BATCH:
            break
    handle = str(uuid.uuid4())
    task: dict[str, Any] = {"TaskHandle": handle, "Status": "COMPLETED", "SourceArn": source_arn,
                            "ApproximateNumberOfMessagesMoved": moved,
                            "ApproximateNumberOfMessagesToMove": moved,
                            "StartedTimestamp": started}
    if destination_arn is not None:
        task["DestinationArn"] = destination_arn
    if rate is not None:
        task["MaxNumberOfMessagesPerSecond"] = rate
    ctx.state.add_move_task(handle, task)
    return {"TaskHandle": handle}


async def list_message_move_tasks(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    source_arn = params.get("SourceArn")
    if source_arn is None:
        raise missing("SourceArn")
    dlq = _move_task_queue(ctx.naming, source_arn, "SourceArn")
    limit = int_param(params, "MaxResults", 1, 10, 1)
    await ctx.bridge.job(lambda engine, caller: _existing(
        "SourceArn", lambda: engine.queue_extras(dlq.lamina_name, caller=caller)))
    tasks = [task for task in reversed(ctx.state.move_tasks.values())
             if task["SourceArn"] == source_arn]
    # SQS shows a task's handle only while it runs; here every listed task has completed.
    return {"Results": [{k: v for k, v in task.items() if k != "TaskHandle"}
                        for task in tasks[:limit]]}


async def cancel_message_move_task(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    handle = params.get("TaskHandle")
    if handle is None:
        raise missing("TaskHandle")
    task = ctx.state.move_tasks.get(handle) if isinstance(handle, str) else None
    if task is None:
        raise SqsError("ResourceNotFoundException", "No such message move task.")
    raise SqsError("UnsupportedOperation", "The message move task has already completed: "
                   "a move task here runs to its end when it starts, so there is nothing "
                   "to cancel.")


async def _permissions(ctx: Context, params: dict[str, Any], action: str) -> dict[str, Any]:
    queue_of(ctx, params)
    raise SqsError("UnsupportedOperation", f"{action} is not supported: access to a queue "
                   "is given to keys with grants (the grant and revoke operations), not to "
                   "AWS account ids.")


async def add_permission(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    return await _permissions(ctx, params, "AddPermission")


async def remove_permission(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    return await _permissions(ctx, params, "RemovePermission")


ACTIONS: dict[str, Action] = {
    **MESSAGE_ACTIONS,
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
    "AddPermission": add_permission,
    "RemovePermission": remove_permission,
}
