"""MCP wiring only: tools, resources and prompts over the package's pure functions, and the
stdio / streamable-HTTP transports. No logic lives here that the CLI cannot reach."""

from __future__ import annotations

import contextlib
import hmac
import inspect
import ipaddress
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from mbridge_perf import __version__
from mbridge_perf.config.derived import Derived, resolved_lines
from mbridge_perf.config.errors import ConfigError, type_problem
from mbridge_perf.config.load import load_config
from mbridge_perf.server_tools import TOOLS
from mbridge_perf.skillpack.pack import (
    CARD_FILE,
    SKILL_FILE,
    Skill,
    find_pack_root,
    list_skills,
    read_pack_text,
)

log = logging.getLogger("mbridge_perf.server")

INSTRUCTIONS = (
    "Megatron Bridge / Megatron-Core training-performance tools and skills. Pass the user's "
    "training config as they have it (a Bridge config mapping or YAML, a Megatron Bridge "
    "recipe name (resource mbridge-perf://recipes), a preset name, dotted overrides, "
    "perf-harness flags). validate_config checks it against Megatron's constraints "
    "before a launch. Read skill://<name>/SKILL.md for the checklist that fits the question "
    "(GPU OOM and memory, activation recompute, long-context MoE, MoE optimisation workflow)."
)

# Prompt name → skill whose answer checklist it walks through.
PROMPTS = {
    "oom_triage": "nemo-mbridge-perf-memory-tuning",
    "recompute_plan": "nemo-mbridge-perf-activation-recompute",
    "long_context_moe_plan": "nemo-mbridge-perf-moe-long-context",
    "moe_optimization_workflow": "nemo-mbridge-perf-moe-optimization-workflow",
}


INVALID_PARAMS = -32602  # JSON-RPC: the request's parameters are wrong


class GuardedServer(MCPServer):
    """MCPServer whose errors read as ours: the SDK's argument-validation dump becomes one
    line naming the argument; a bad prompt request is an invalid-params error saying what
    to send, not "Internal server error"."""

    pack_root: Path | None = None  # the skill pack build_server read; server_tools.pack_root

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None
                        ) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                raise ToolError(f"Error executing tool {name}: {argument_problem(cause)}"
                                ) from cause
            raise

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None,
                         context: Any = None) -> Any:
        prompt = self._prompt_manager.get_prompt(name)
        if prompt is None:
            known = ", ".join(p.name for p in self._prompt_manager.list_prompts())
            raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}; prompts are {known}")
        missing = [a.name for a in prompt.arguments or []
                   if a.required and not (arguments or {}).get(a.name)]
        if missing:
            raise MCPError(INVALID_PARAMS, f"prompt {name}: argument {missing[0]!r} is "
                                           "required: describe the user's situation in it")
        return await super().get_prompt(name, arguments, context)


def argument_problem(exc: ValidationError) -> str:
    """The first argument error as `field: problem. Fix …` — our words, never a dump."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "arguments"
    return f"{loc}: {type_problem(err)}. Fix that argument and call again."


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every tool's one error path: our ValueErrors (ConfigError, BenchError, …) keep their
    message; anything else becomes a message naming the tool, so no exception's repr ever
    reaches the client (the traceback goes to the server log)."""
    import functools

    def problem(exc: BaseException) -> ToolError:
        if isinstance(exc, ToolError):
            return exc
        if isinstance(exc, ValueError):  # a ConfigError names a field, other errors a value
            what = "that field" if isinstance(exc, ConfigError) else "that"
            return ToolError(f"{' '.join(str(exc).split())}. Fix {what} and call again.")
        if isinstance(exc, RecursionError | MemoryError):
            return ToolError("the input is too deeply nested or too large to read; simplify "
                             "it and call again")
        log.exception("%s failed", fn.__name__)
        return ToolError(f"{fn.__name__} could not handle this input ({type(exc).__name__}); "
                         "the server log has the details")

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                raise problem(exc) from None
        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise problem(exc) from None
    return run


def _reader(path: Path, root: Path) -> Callable[[], str]:
    def read() -> str:  # checked again on each read: a file swapped for a symlink later
        return read_pack_text(path, root)

    return read


def _register_tools(server: MCPServer) -> list[str]:
    """Register every tool in server_tools.TOOLS (each exists; never a stub); return their
    names."""
    for fn, title, hints in TOOLS:
        # cleandoc: the docstring is the description the assistant reads, without indentation
        server.tool(title=title, annotations=hints,
                    description=inspect.cleandoc(fn.__doc__ or ""))(guarded(fn))
    return [fn.__name__ for fn, _, _ in TOOLS]


def _register_resources(server: MCPServer, skills: list[Skill]) -> None:
    for skill in skills:
        name = skill.folder_name
        desc = str(skill.frontmatter.get("description", ""))
        server.resource(f"skill://{name}/SKILL.md", name=f"{name}/SKILL.md",
                        title=f"{name} (SKILL.md)", description=desc,
                        mime_type="text/markdown")(_reader(skill.path / SKILL_FILE, skill.root))
        server.resource(f"skill://{name}/card.yaml", name=f"{name}/card.yaml",
                        title=f"{name} (card.yaml)",
                        description=f"Machine-readable card of {name}: answer checklist, "
                                    "measured results, constraints, rule ids.",
                        mime_type="application/yaml")(_reader(skill.path / CARD_FILE, skill.root))
        # SKILL.md links references/<file>.md; the same relative path resolves here
        for ref in skill.references():
            rel = f"references/{ref.name}"
            server.resource(f"skill://{name}/{rel}", name=f"{name}/{rel}",
                            title=f"{name} ({rel})",
                            description=f"Detail that {name}'s SKILL.md links to; read it "
                                        "when the answer needs it.",
                            mime_type="text/markdown")(_reader(ref, skill.root))

    @server.resource("mbridge-perf://rules", name="rules", title="Validator rule catalog",
                     description="Every validate_config rule: id, severity, constraint ref, "
                                 "source, fields, summary, documenting skill.",
                     mime_type="application/json")
    def rules_resource() -> str:
        from mbridge_perf.rules.catalog import describe_rules

        return json.dumps(describe_rules(), indent=1)

    @server.resource("mbridge-perf://presets", name="presets", title="Model presets",
                     description="Every preset with its model-section fields and sources.",
                     mime_type="application/json")
    def presets_resource() -> str:
        from mbridge_perf.config.presets import load_presets

        return json.dumps({n: p.model_dump(mode="json") for n, p in load_presets().items()},
                          indent=1)

    @server.resource("mbridge-perf://recipes", name="recipes",
                     title="Megatron Bridge 0.6.2 recipes",
                     description="Every recipe config.recipe accepts: name, model, task, GPU "
                                 "count, GPU, precision, variant and layout (TP, PP, VPP, CP, "
                                 "EP, ETP, MBS, GBS, seq).",
                     mime_type="application/json")
    def recipes_resource() -> str:
        from mbridge_perf.config.recipes import list_recipes

        return json.dumps([r.model_dump(mode="json") for r in list_recipes()], indent=1)


# Skills whose prompts triage an OOM first (diagnose_oom), then run the ladder.
OOM_SKILLS = ("nemo-mbridge-perf-memory-tuning", "nemo-mbridge-perf-activation-recompute")


def _checklist_prompt(skill: Skill, tools: list[str]) -> Callable[..., str]:
    name = skill.folder_name

    def render(situation: str, config: str = "") -> str:
        items = skill.card["answer_checklist"]
        steps = "\n".join(f"{i}. {item['text']}" for i, item in enumerate(items, 1))
        calls = ", ".join(t for t in ("validate_config", "estimate_memory",
                                      "recommend_recompute", "plan_parallelism") if t in tools)
        parts = [f"Use the {name} skill (read skill://{name}/SKILL.md first).",
                 f"Situation: {situation.strip()}"]
        if name in OOM_SKILLS and "diagnose_oom" in tools:
            parts.append("If the situation includes an OOM message or a training log, call "
                         "diagnose_oom with that text (and the config, if any) first.")
        if name == PROMPTS["long_context_moe_plan"] and "plan_parallelism" in tools:
            parts.append("Call plan_parallelism (the model as a preset or the config, GPU "
                         "count and type, seq_length, global_batch_size) for the ranked "
                         "layouts and their per-stage memory before sizing CP, EP, TP or PP "
                         "by hand; then validate_config on the layout you pick.")
        if config.strip():
            fence = fence_for(config)
            parts.append(f"Training config:\n{fence}yaml\n{config.strip()}\n{fence}")
            parts += _reading(config)
            parts.append(f"Call {calls} with this config (as config.bridge_config) before "
                         "recommending anything, and quote the findings you rely on.")
        parts.append("Answer in this order, the skill's first-answer checklist:\n" + steps)
        parts.append("Use Megatron Bridge field names verbatim and say what you did not "
                     "measure.")
        return "\n\n".join(parts)

    return render


def fence_for(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text`` (at least three), so
    nothing inside the text can close it early (CommonMark closes a fence only with a run of
    the same character at least as long)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _reading(config: str) -> list[str]:
    """The config as every tool reads it (the resolved view), so the assistant starts from
    the same first selective modules, attention and graph scope; nothing when it does not load
    (the tool calls the prompt asks for then say why)."""
    try:
        d = Derived(load_config(text=config))
    except (ConfigError, ValueError):
        return []
    return ["How the tools read this config:\n" + "\n".join(resolved_lines(d))]


def _register_prompts(server: MCPServer, skills: list[Skill], tools: list[str]) -> None:
    by_name = {s.folder_name: s for s in skills}
    for prompt, skill_name in PROMPTS.items():
        skill = by_name.get(skill_name)
        if skill is None:
            continue
        desc = (f"Walk through the {skill_name} answer checklist for the user's situation; "
                "optionally validate their config first.")
        fn = _checklist_prompt(skill, tools)
        fn.__name__ = prompt
        fn.__doc__ = desc
        server.prompt(name=prompt, title=prompt.replace("_", " ").capitalize(),
                      description=desc)(fn)


def build_server(pack_root: Path | None = None) -> MCPServer:
    """The whole server; skill files are read on each request so edits show at once."""
    root = pack_root or find_pack_root()
    skills = list_skills(root)
    server = GuardedServer("mbridge-perf", version=__version__, instructions=INSTRUCTIONS)
    server.pack_root = root  # grade_answer reads the pack it was built on
    tools = _register_tools(server)
    _register_resources(server, skills)
    _register_prompts(server, skills, tools)
    return server


# ------------------------------------------------------------------ HTTP transport

TOKEN_ENV = "MBRIDGE_PERF_TOKEN"
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_loopback(host: str) -> bool:
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class HttpGuard:
    """ASGI guard in front of the MCP app: a bearer token when one is configured, and no
    browser Origin other than localhost (a web page must not drive a local server)."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = {k.lower(): v for k, v in scope.get("headers", [])}
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw.items()}
        origin = headers.get("origin")
        if origin and not _local_origin(origin):
            await _reply(send, 403, "origin not allowed: only localhost pages may call this "
                                    "server")
            return
        if self.token is not None:  # bytes on both sides: any token, any header, no 500
            scheme, _, value = raw.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not _token_matches(value.strip(), self.token):
                await _reply(send, 401, "missing or wrong bearer token", www_auth=True)
                return
        await self.app(scope, receive, send)


def _token_matches(given: bytes, token: str) -> bool:
    """Constant-time compare of the header's bytes with the token as UTF-8 (what most
    clients send) or Latin-1 (what some send for a non-ASCII header)."""
    forms = {token.encode("utf-8")}
    with contextlib.suppress(UnicodeEncodeError):
        forms.add(token.encode("latin-1"))
    return any([hmac.compare_digest(given, form) for form in forms])


def _local_origin(origin: str) -> bool:
    from urllib.parse import urlsplit

    host = urlsplit(origin).hostname
    return host is not None and is_loopback(host)


async def _reply(send: Any, status: int, text: str, www_auth: bool = False) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if www_auth:
        headers.append((b"www-authenticate", b'Bearer realm="mbridge-perf"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode()})


def http_app(server: MCPServer, host: str, token: str | None) -> Any:
    """The streamable-HTTP app at /mcp behind the guard; refuses a non-loopback bind without
    a token (anyone on the network could otherwise drive the tools)."""
    from mcp.server.transport_security import TransportSecuritySettings

    from mbridge_perf.http_bounds import BodyBounds

    if not is_loopback(host) and not token:
        raise ConfigError("--host", f"binding {host} (not loopback) needs a bearer token: pass "
                                    f"--token or set {TOKEN_ENV}")
    local = is_loopback(host)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=local,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"] if local else [],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"])
    app = server.streamable_http_app(transport_security=security, host=host,
                                     max_sessions=HTTP_MAX_SESSIONS,
                                     session_idle_timeout=HTTP_IDLE_TIMEOUT_S)
    bound_sessions(server.session_manager)
    return HttpGuard(BodyBounds(app), token)


# HTTP sessions per server: a bounded count (each holds a server task and its streams, so the
# count bounds memory) and a bounded idle lifetime. When every slot is taken, a new client
# evicts a session instead of being refused, so no flood locks new clients out (an evicted
# client gets 404 and, per the MCP spec, starts a new session): the session idle the longest,
# or, when every session holds a request or a GET stream open (a flood of sessions that each
# keep an SSE stream open would otherwise hold every slot forever), the one whose latest
# request started the longest ago; its streams are closed with it.
HTTP_MAX_SESSIONS = 256
HTTP_IDLE_TIMEOUT_S = 600.0


def bound_sessions(manager: Any) -> None:
    """Make ``manager`` evict a session when full (SDK manager internals: ``_admit_session``,
    ``_server_instances``; left as the SDK made it if they change). Each admitted transport
    notes when its latest request started (``last_request_at``), which ranks busy sessions."""
    import time

    admit = getattr(manager, "_admit_session", None)
    sessions = getattr(manager, "_server_instances", None)
    if admit is None or not isinstance(sessions, dict):
        return

    def admit_or_evict(requestor: Any) -> Any:
        limit = manager.max_sessions
        if limit is not None and len(sessions) >= limit:
            _evict_one(manager, sessions)
        transport = admit(requestor)
        if transport is not None:
            _note_requests(transport, time.monotonic)
        return transport

    manager._admit_session = admit_or_evict


def _note_requests(transport: Any, clock: Callable[[], float]) -> None:
    """Stamp ``transport.last_request_at`` now and whenever a request reaches it."""
    handle = transport.handle_request
    transport.last_request_at = clock()

    async def noted(scope: Any, receive: Any, send: Any) -> None:
        transport.last_request_at = clock()
        await handle(scope, receive, send)

    transport.handle_request = noted


def _evict_one(manager: Any, sessions: dict[str, Any]) -> None:
    """Evict the longest-idle started session; when none is idle, the busy one whose latest
    request started the longest ago. A session still starting is never evicted."""
    idle, busy = [], []
    for sid, transport in sessions.items():
        scope = getattr(transport, "idle_scope", None)
        if scope is None:
            continue  # not started yet
        if getattr(transport, "_requests_in_flight", 1):
            busy.append((getattr(transport, "last_request_at", 0.0), sid))
        else:
            idle.append((scope.deadline, sid))
    if not idle and not busy:
        return
    _, sid = min(idle or busy)
    transport = sessions.pop(sid)
    owners = getattr(manager, "_session_owners", None)
    if isinstance(owners, dict):
        owners.pop(sid, None)
    transport.idle_scope.cancel()  # its server task ends and terminates the transport
    log.info("evicted %s HTTP session %s to admit a new client", "idle" if idle else "busy",
             sid[:8])


def serve_http(server: MCPServer, host: str, port: int, token: str | None) -> None:
    import uvicorn

    app = http_app(server, host, token)
    log.info("mbridge-perf MCP over streamable HTTP at http://%s:%d/mcp", host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning")
