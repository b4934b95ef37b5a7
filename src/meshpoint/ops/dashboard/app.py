"""The dashboard's web application: its routes, how each reads the store, and how
the writes (an approval, a denial, a reply) are checked and recorded.

:func:`create_app` builds a Starlette application on an open store (the caller's)
or on a store opener (opened and closed with the application). Pages are rendered
on the server with Jinja2 (autoescaped: whatever a requester wrote is shown as
text); the live events page polls ``/events/feed``. A write is a POST whose form
carries the session's CSRF token from a session signed in with the token
(:mod:`meshpoint.ops.dashboard.security`); anything else is refused, 403, before the
store is touched. An answer is recorded by
:func:`meshpoint.runtime.approvals.decide`, as ``meshpoint tasks approve`` records
it: checked first (the call is pending, the edited arguments satisfy the tool's
schema), and the first answer wins; a refused one is shown on its form.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from meshpoint.errors import (
    AlreadyAnsweredError,
    AnswerRefusedError,
    InvalidArgumentError,
    MeshpointError,
    NotFoundError,
    UnreadableValueError,
)
from meshpoint.ops.dashboard import forms, security, views
from meshpoint.store.schema import TASK_STATUSES

HERE = Path(__file__).parent
#: The latest ``since_us`` the live feed takes (the year 9999: a datetime's last).
MAX_SINCE_US = 253_402_300_799_000_000
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["when"] = views.when
templates.env.globals["statuses"] = TASK_STATUSES


def create_app(*, store: Any = None, opener: Any = None, token: str | None = None,
               approvers: Any = None, allowed_hosts: list[str] | None = None) -> Starlette:
    """The dashboard on ``store`` (open, the caller closes it) or on the store
    ``opener`` gives (opened at startup, closed at shutdown). ``token`` makes it
    writable (None: read-only); ``approvers`` (the mesh config's) check each answer
    before it is written, as ``meshpoint tasks approve --config`` does.
    ``allowed_hosts``: the names a request's ``Host`` may give (None: any); a page
    served on the loopback allows only the loopback's, so that a web page whose
    name is rebound to 127.0.0.1 cannot read it."""
    if (store is None) == (opener is None):
        raise InvalidArgumentError("give the dashboard a store or a store opener, one")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if opener is None:
            yield
            return
        async with opener as opened:
            app.state.store = opened
            yield

    app = Starlette(
        routes=[
            Route("/", overview), Route("/tasks", task_list),
            Route("/tasks/{task_id:path}/calls/{call_id}/{action}", answer, methods=["POST"]),
            Route("/tasks/{task_id:path}/reply", reply, methods=["POST"]),
            Route("/tasks/{task_id:path}", task_page),
            Route("/approvals", approvals), Route("/events", events_page),
            Route("/events/feed", events_feed),
            Route("/login", login_page), Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        middleware=[Middleware(security.SecurityHeaders),
                    Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"],
                               www_redirect=False),
                    Middleware(SessionMiddleware, secret_key=security.session_key(token),
                               session_cookie="meshpoint_dashboard", same_site="strict",
                               https_only=False, max_age=12 * 3600)],
        lifespan=lifespan, exception_handlers={NotFoundError: not_found,
                                               InvalidArgumentError: bad_request,
                                               MeshpointError: store_error})
    app.state.store, app.state.token, app.state.approvers = store, token, approvers
    app.state.role_warning = None  # read at the first page
    app.state.login_failures = asyncio.Lock()  # wrong tokens are judged one at a time
    return app


async def render(request: Request, name: str, status_code: int = 200,
                 **context: Any) -> Response:
    """A page, with what every page shows: the tenant, whether writable and signed in,
    the CSRF token for its forms, and a warning when row-level security does not hold
    the store's role."""
    store, state = request.app.state.store, request.app.state
    if state.role_warning is None:
        state.role_warning = await views.role_warning(store)
    return templates.TemplateResponse(request, name, {
        "role_warning": state.role_warning,
        "tenant": store.tenant_id, "dialect": store.dialect,
        "writable": request.app.state.token is not None,
        "signed_in": security.signed_in(request), "csrf": security.csrf_token(request),
        **context}, status_code=status_code)


async def not_found(request: Request, error: Exception) -> Response:
    return await render(request, "error.html", 404, title="not found", message=str(error))


async def bad_request(request: Request, error: Exception) -> Response:
    """An id, cursor or filter the store refuses (too long, say): 400, its message."""
    return await render(request, "error.html", 400, title="bad request", message=str(error))


async def store_error(request: Request, error: Exception) -> Response:
    """A store error a page met (a row sealed under a key not held, say): its
    message, never a traceback."""
    return await render(request, "error.html", 500, title="cannot be shown", message=str(error))


async def overview(request: Request) -> Response:
    return await render(request, "overview.html", **await views.overview(request.app.state.store))


async def task_list(request: Request) -> Response:
    """Paused tasks in id order, a page at a time (``after``: the last id of the page
    before), of one status and one agent if asked, ids starting with ``q``."""
    store = request.app.state.store
    args = request.query_params
    status = args.get("status") or None
    agent = args.get("agent") or None
    prefix, after = args.get("q", "").strip(), args.get("after", "")
    if status is not None and status not in TASK_STATUSES:
        return await render(request, "error.html", 400, title="bad filter",
                            message=f"{status!r} is not a status of a paused task; one of "
                                    f"{', '.join(TASK_STATUSES)}")
    rows = await store.tasks_page(after=after, prefix=prefix, agent_name=agent,
                                  status=status, limit=views.PAGE + 1)
    more = len(rows) > views.PAGE
    rows = rows[:views.PAGE]
    return await render(request, "tasks.html", tasks=rows, status=status or "", agent=agent or "",
                        q=prefix, after=after, next_after=rows[-1].task_id if more else None)


async def task_page(request: Request) -> Response:
    """One task (404 for one the tenant does not have: another tenant's too)."""
    store = request.app.state.store
    task_id = request.path_params["task_id"]
    task = await views_task(store, task_id)
    return await render(request, "task.html", task=task,
                        chain=await views.chain(store, task_id),
                        events=await views.events(store, task=task_id, limit=200),
                        forms=approval_forms(task), errors={}, refused=None,
                        done=_done(request.query_params.get("done")))


def _done(said: str | None) -> str | None:
    """The answer just recorded, for its banner: one of ours, never free text."""
    return said if said in ("approved", "denied", "replied") else None


async def views_task(store: Any, task_id: str) -> dict[str, Any]:
    from meshpoint.cli.details import task_details

    task = await task_details(store, task_id, turns=50, schemas=True, sealed_ok=True)
    task["conversation"] = [{"role": e.get("role"), "text": "(sealed: no key to read it)"
                             if views.sealed(e) else said(e)}
                            for e in task["conversation"] if isinstance(e, dict)]
    return task


def said(event: dict[str, Any]) -> str:
    """A conversation event's text, else the tools it called."""
    content = event.get("content")
    if content:
        return str(content)
    calls = [str((c.get("function") or {}).get("name") or c.get("name") or "?")
             for c in event.get("tool_calls") or [] if isinstance(c, dict)]
    return f"(calls {', '.join(calls)})" if calls else "(no text)"


def approval_forms(task: dict[str, Any]) -> dict[str, list[forms.Field]]:
    """The form fields of each pending approval of the task, by call id."""
    return {w["call_id"]: forms.fields(w.get("parameters") or {}, w["arguments"])
            for w in task["waiting_on"] if w["kind"] == "approval"}


async def approvals(request: Request) -> Response:
    calls, next_after = await views.inbox(request.app.state.store,
                                          after=request.query_params.get("after", ""))
    return await render(request, "approvals.html", calls=calls, next_after=next_after,
                        fields={c["call_id"]: forms.fields(c["schema"], c["arguments"])
                                for c in calls},
                        errors={})


async def _checked_form(request: Request) -> tuple[dict[str, str], Response | None]:
    """The POSTed form, and the 403 to answer instead when the write is refused."""
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    why = security.refusal(request, form.get("csrf"), request.app.state.token)
    if why is None:
        return form, None
    return form, await render(request, "error.html", 403, title="refused", message=why)


async def answer(request: Request) -> Response:
    """Approve (with the form's edited arguments) or deny one pending call."""
    from meshpoint.runtime.approvals import Approve, Deny

    form, refused = await _checked_form(request)
    if refused is not None:
        return refused
    store = request.app.state.store
    task_id, call_id = request.path_params["task_id"], request.path_params["call_id"]
    action, by = request.path_params["action"], (form.get("by") or "dashboard").strip()
    try:
        if action == "approve":
            waiting = await _pending(store, task_id, call_id)
            patch = forms.edit(waiting.get("parameters") or {}, waiting["arguments"], form)
            decision: Any = checked(Approve, call_id=call_id, arguments=patch, by=by)
        elif action == "deny":
            decision = checked(Deny, call_id=call_id, reason=form.get("reason") or "denied",
                               by=by)
        else:
            return await render(request, "error.html", 404, title="not found",
                                message=f"no action {action!r}: approve or deny")
        return await _decide(request, task_id, decision, by, call_id, action)
    except (AnswerRefusedError, InvalidArgumentError, UnreadableValueError) as error:
        return await _refused(request, task_id, call_id, error, form)


async def reply(request: Request) -> Response:
    """Answer a waiting task in words: its pending calls are not run."""
    from meshpoint.runtime.approvals import Reply

    form, refused = await _checked_form(request)
    if refused is not None:
        return refused
    task_id = request.path_params["task_id"]
    by = (form.get("by") or "dashboard").strip()
    try:
        return await _decide(request, task_id, checked(Reply, text=form.get("text") or "",
                                                       by=by), by, None, "reply")
    except (AnswerRefusedError, InvalidArgumentError, UnreadableValueError) as error:
        return await _refused(request, task_id, "reply", error)


def checked(model: Any, **fields: Any) -> Any:
    """The decision ``model`` of the form's ``fields``; InvalidArgumentError naming the
    field for one it refuses (a reason or name too long, say), shown on the form."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the form"
        raise InvalidArgumentError(f"{where}: {first['msg']}") from None


async def _pending(store: Any, task_id: str, call_id: str) -> dict[str, Any]:
    """The pending approval ``call_id`` of the task, as the task page shows it."""
    from meshpoint.errors import NotPendingError

    task = await views_task(store, task_id)
    for waiting in task["waiting_on"]:
        if waiting["call_id"] == call_id and waiting["kind"] == "approval":
            return dict(waiting)
    raise NotPendingError(f"task {task_id!r} has no pending call {call_id!r} waiting for "
                          "approval: the id is wrong, or the task has moved on")


async def _decide(request: Request, task_id: str, decision: Any, by: str,
                  call_id: str | None, action: str) -> Response:
    from meshpoint.runtime.approvals import decide

    await decide(request.app.state.store, task_id, decision, by=by,
                 approvers=request.app.state.approvers)
    done = {"approve": "approved", "deny": "denied", "reply": "replied"}[action]
    return RedirectResponse(f"/tasks/{quote(task_id)}?done={done}", status_code=303)


async def _refused(request: Request, task_id: str, key: str, error: MeshpointError,
                   form: dict[str, str] | None = None) -> Response:
    """The task page again, the refusal shown on the form it came from: 409 for a
    call answered first, 400 for the rest (an argument the schema refuses, a call
    sealed under a key not held...; nothing was written)."""
    store = request.app.state.store
    task = await views_task(store, task_id)
    status = 409 if isinstance(error, AlreadyAnsweredError) else 400
    fields = approval_forms(task)
    if form is not None and key in fields:  # the form as it was sent, to correct it
        fields[key] = [dataclasses.replace(f, value=form.get(forms.PREFIX + f.name, f.value))
                       for f in fields[key]]
    # A refusal with no form left to show it on (the task moved on, or ended) is
    # shown above the page.
    shown = key in fields or (key == "reply" and bool(fields))
    return await render(request, "task.html", status, task=task,
                        chain=await views.chain(store, task_id),
                        events=await views.events(store, task=task_id, limit=200),
                        forms=fields, errors={key: str(error)}, done=None,
                        refused=None if shown else str(error))


async def events_page(request: Request) -> Response:
    args = request.query_params
    task, agent = args.get("task") or None, args.get("agent") or None
    found = await views.events(request.app.state.store, task=task, agent=agent, limit=100)
    return await render(request, "events.html", events=found, task=task or "", agent=agent or "")


async def events_feed(request: Request) -> Response:
    """The events from ``since_us`` (inclusive) as JSON, for the live page; it
    asks again from a little before the newest it has, and drops those it shows."""
    args = request.query_params
    try:
        since_us = int(args.get("since_us", "0"))
    except ValueError:
        since_us = -1
    if not 0 <= since_us <= MAX_SINCE_US:
        return JSONResponse({"error": "since_us must be an integer of microseconds since "
                                      f"the epoch, 0 to {MAX_SINCE_US}"}, status_code=400)
    found = await views.events(request.app.state.store, task=args.get("task") or None,
                               agent=args.get("agent") or None, since_us=since_us, limit=500)
    return JSONResponse({"events": found})


async def login_page(request: Request) -> Response:
    return await render(request, "login.html", error=None)


async def login(request: Request) -> Response:
    """Sign in with the token; 403 on a wrong one, a wrong CSRF token, or none
    configured."""
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    token = request.app.state.token
    if token is None:
        return await render(request, "login.html", 403, error=security.refusal(request, None, None))
    if not security.csrf_matches(request, form.get("csrf")) or \
            not security.token_matches(form.get("token"), token):
        await security.login_failed(request.app.state.login_failures)
        return await render(request, "login.html", 403, error="wrong token (or a stale form)")
    request.session.clear()
    request.session["signed_in"] = True
    security.csrf_token(request)  # a new CSRF token for the signed-in session
    return RedirectResponse("/approvals", status_code=303)


async def logout(request: Request) -> Response:
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    if not security.csrf_matches(request, form.get("csrf")):
        return await render(request, "error.html", 403, title="refused",
                            message="the form's CSRF token is not this session's")
    request.session.clear()
    return RedirectResponse("/", status_code=303)
