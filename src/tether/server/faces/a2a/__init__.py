"""The A2A face (Agent2Agent, https://a2a-protocol.org): each agent a remote A2A agent.

Discovery: ``GET /.well-known/agent-card.json`` is the card of the app's first agent, and
``GET /a2a/{agent}/.well-known/agent-card.json`` each agent's own; a card's interfaces point
at ``POST /a2a/{agent}``, JSON-RPC 2.0 in A2A 1.0 and in 0.3 (streaming: true; push
notifications and the extended card: no). When the server has API keys, the card names a
bearer API key as the security scheme it requires; the card itself is public then (it is how a
client learns that), and in local mode it is served to whoever local mode serves.

Methods, in both spellings (the answer comes in the spelling asked): ``SendMessage`` /
``message/send``, ``SendStreamingMessage`` / ``message/stream`` (SSE), ``GetTask`` /
``tasks/get``, ``CancelTask`` / ``tasks/cancel``, ``SubscribeToTask`` / ``tasks/resubscribe``.
Push-notification methods answer PushNotificationNotSupported (-32003); ``ListTasks`` and the
extended card UnsupportedOperation (-32004).

Mapping (:mod:`.tasks` has the states): ``contextId`` is a tether session in the caller's
namespace, made by the first message that names none (its id comes back as the task's
``contextId``); a message naming a context the caller does not have (unknown, expired, another
principal's) is refused with TaskNotFound (-32001: A2A has no error of its own for a context,
and this is its "not found or not yours"; the ErrorInfo's metadata holds the ``contextId``),
never a fresh chat in its place. A task is one turn, its id ``<contextId>/<turn id>``;
``messageId`` is the turn's idempotency key, so a retried message is not run twice.
``metadata.policy`` of SendMessage picks tether's policy for a busy context (enqueue,
reject, interrupt, rollback); a refusal (reject and busy, a full queue, a per-principal bound,
a server shutting down) is a ``rejected`` task that nothing stored.

Human decisions: a turn that waits for a tool approval or ``ask_user`` is ``input-required``;
its status message says what is asked (the tool and its arguments, or the question and its
choices), in words and as a data part ``{"decisions": [{callId, kind, tool, arguments |
question, choices, verdicts, deadline}]}``. Answer with a message naming the task (``taskId``,
and its ``contextId`` or none): text ``approve``, ``deny`` or ``always`` for an approval, the
answer itself for a question; or a data part ``{"verdict": "approve"|"deny"|"always"|"answer",
"answer": "…", "callId": "…"}`` (``{"answer": "…"}`` alone answers). Without ``callId`` it
decides the first pending decision. The turn then goes on, and the reply to that message is the
task again, run on to its end (or to its next question). A message to a task that is not
``input-required`` is UnsupportedOperation (-32004).

The endpoint's agent runs a new turn, whichever agent a context began with (as ``POST
/agents/{name}``); a message answering a task streams from the task ``submitted`` (the decision
queued it again) to its end.

Built on a2a-sdk's types, not on its server: its request handler runs an ``AgentExecutor`` in
the process that took the request and keeps tasks in its own ``TaskStore``, while a tether
turn runs wherever the session is leased and lives in tether's store. So this is a thin
JSON-RPC adapter (:mod:`.wire`) that validates and writes with the SDK's protobuf messages (and
its 0.3 models and conversions), and reads every task from the store: ``GetTask`` and
``CancelTask`` work on any process.

Errors are JSON-RPC error objects (HTTP 200) with a ``google.rpc.ErrorInfo`` detail in 1.0;
a missing or unknown API key is HTTP 401 with ``WWW-Authenticate: Bearer`` (code -32000), an
unknown agent in the path HTTP 404 (-32601).
"""

from tether.server.faces.a2a.routes import router

__all__ = ["router"]
