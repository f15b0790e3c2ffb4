"""Flask app: the WebShop pages for people (original URL scheme) and a JSON API for agents.

Agent API (JSON in, JSON out; errors are 4xx/5xx JSON ``{"error": ..., "status": ...}``):

=======================================  ================================================================
``GET  /health``                         catalog/goal/split sizes, live sessions
``POST /api/sessions``                   ``{"split": "train", "index": 3}`` (or ``"seed"``, or
                                         ``"goal_index"``; optional ``"observation_mode"``) -> new session
``GET  /api/sessions/<sid>``             current observation (``?mode=text|text_rich|html|url``)
``POST /api/sessions/<sid>/step``        ``{"action": "search[red shoes]"}`` -> observation, reward, done,
                                         valid, message, available_actions, reward_info (when done)
``DELETE /api/sessions/<sid>``           drop the session
``GET  /api/goals/<goal_index>``         one goal (ASIN, options, price bound, instruction): for
                                         scripted experts and debugging, never shown to the agent
=======================================  ================================================================

Browser pages: ``/`` (new session, optional ``?split=&index=``), ``/<sid>``,
``/search_results/<sid>/<keywords>/<page>``, ``/item_page/<sid>/<asin>/<keywords>/<page>/<options>``,
``/item_sub_page/<sid>/<asin>/<keywords>/<page>/<sub_page>/<options>``, ``/done/<sid>/<asin>/<options>``.
"""

from __future__ import annotations

import ast
import json
import logging
import random
import secrets
import time
from typing import Any

from flask import Flask, Response, g, jsonify, redirect, request
from werkzeug.exceptions import HTTPException

from envs.webshop_server.engine import SUB_PAGES, PageState, Session, Urls
from envs.webshop_server.shop import Shop, ShopFull

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024
MAX_URL_PART_CHARS = 2000
MODES = ("text", "text_rich", "html", "url")


class ApiError(Exception):
    """An error answered as JSON with an HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Redirect(Exception):
    """Answered with HTTP 307 to ``location`` (a session of another worker process)."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


def _json_body() -> dict[str, Any]:
    raw = request.get_data(cache=False)
    if not raw:
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "request body is not valid UTF-8") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"request body is not valid JSON: {e.msg}") from None
    except ValueError as e:  # e.g. an integer literal past Python's 4300-digit conversion limit
        raise ApiError(400, f"request body is not acceptable JSON: {str(e)[:120]}") from None
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _int_field(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"field {name!r} must be an integer, got {type(value).__name__}")
    return value


def _mode(value: Any) -> str:
    mode = "text" if value is None else value
    if mode not in MODES:
        raise ApiError(400, f"observation mode must be one of {list(MODES)}, got {mode!r}")
    return mode


def _literal(text: str, kind: type, what: str) -> Any:
    """Parse a URL part holding a Python/JSON literal of type ``kind`` with string items."""
    if len(text) > MAX_URL_PART_CHARS:
        raise ApiError(414, f"{what} part of the URL is longer than {MAX_URL_PART_CHARS} characters")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ApiError(400, f"{what} part of the URL is not a valid literal: {text[:80]!r}") from None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else None
    if not isinstance(value, kind) or any(not isinstance(v, str) for _, v in items):
        raise ApiError(400, f"{what} part of the URL must be a {kind.__name__} of strings")
    if isinstance(value, dict) and any(not isinstance(k, str) for k in value):
        raise ApiError(400, f"{what} part of the URL must have string keys")
    return value


def parse_keywords(text: str) -> list[str]:
    """Keywords URL part: ``"['red', 'shoes']"`` -> list, else the whole string as one keyword (original rule)."""
    if text.startswith("["):
        return _literal(text, list, "keywords")
    if len(text) > MAX_URL_PART_CHARS:
        raise ApiError(414, f"keywords part of the URL is longer than {MAX_URL_PART_CHARS} characters")
    return [text]


def parse_options(text: str) -> dict[str, str]:
    """Options URL part: ``"{'color': 'red'}"`` (or JSON) -> dict."""
    return _literal(text, dict, "options")


def parse_page(text: str) -> int:
    """Page URL part -> int >= 1."""
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or int(text) < 1:  # "²".isdigit() is True
        raise ApiError(400, f"page must be a positive integer, got {text[:20]!r}")
    return int(text)


def _require_goals(shop: Shop, split: str) -> None:
    """409 naming the split and every split's size when ``split`` holds no goal (a small catalog)."""
    if split in shop.splits.ranges and shop.splits.size(split) == 0:
        sizes = ", ".join(f"{s} {shop.splits.size(s)}" for s in ("train", "eval", "test"))
        raise ApiError(409, f"split {split!r} has no goals (this catalog's {len(shop.goals)} goals split as "
                            f"{sizes}; use a larger catalog or another split)")


def create_app(shop: Shop) -> Flask:
    """The Flask app serving ``shop`` (never run it with debug; use ``python -m envs.webshop_server``)."""
    app = Flask(__name__, static_folder="static", static_url_path="/static")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.json.sort_keys = False  # keep the original breakdown key order

    @app.errorhandler(ApiError)
    def _api_error(e: ApiError):
        return jsonify(error=e.message, status=e.status), e.status

    @app.errorhandler(Redirect)
    def _redirect(e: Redirect):
        response = jsonify(error="session held by another worker", location=e.location, status=307)
        response.status_code, response.headers["Location"] = 307, e.location
        return response

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException):
        return jsonify(error=e.description, status=e.code), e.code

    @app.errorhandler(Exception)
    def _internal(e: Exception):
        log.exception("internal error on %s", request.path)
        return jsonify(error=f"internal error: {type(e).__name__}", status=500), 500

    @app.before_request
    def _check_url():
        g.t0 = time.perf_counter()
        if "\ufffd" in request.path:
            raise ApiError(400, "URL is not valid UTF-8")

    @app.after_request
    def _timing(response: Response) -> Response:
        t0 = g.get("t0")
        if t0 is not None:  # time spent in the app, for the benchmark
            response.headers["X-Elapsed-Ms"] = f"{(time.perf_counter() - t0) * 1000:.3f}"
        return response

    def session_or_404(sid: str) -> Session:
        if len(sid) > 100:
            raise ApiError(404, "unknown session id")
        owner = shop.owner_url(sid)
        if owner is not None:  # another worker process holds it: send the client there
            raise Redirect(owner + request.path + (f"?{request.query_string.decode()}" if request.query_string else ""))
        session = shop.get_session(sid)
        if session is None:
            raise ApiError(404, f"unknown or expired session id {sid[:40]!r}")
        return session

    def session_view(session: Session, mode: str) -> dict[str, Any]:
        view = {
            "session_id": session.sid,
            "goal_index": session.goal_index,
            "instruction": session.goal["instruction_text"],
            "observation": session.observation(mode),
            "observation_mode": mode,
            "available_actions": session.actions,
            "url": session.url,
            "page": session.state.kind,
            "done": session.done,
            "reward": session.reward if session.done else 0.0,
            "steps": session.steps,
        }
        if shop.session_url is not None:
            view["session_url"] = shop.session_url
        if session.done:
            view["reward_info"] = session.reward_info
            view["purchase"] = {k: v for k, v in (session.purchase or {}).items() if k != "reward_info"}
        return view

    # ----- agent API -------------------------------------------------------------------------------
    @app.get("/health")
    def health():
        return jsonify(status="ok", **shop.describe())

    @app.get("/api/goals/<int:goal_index>")
    def api_goal(goal_index: int):
        if not 0 <= goal_index < len(shop.goals):
            raise ApiError(404, f"goal index {goal_index} out of range [0, {len(shop.goals)})")
        return jsonify(shop.goals[goal_index])

    @app.post("/api/sessions")
    def api_create():
        body = _json_body()
        mode = _mode(body.get("observation_mode"))
        goal_index = _int_field(body, "goal_index")
        if goal_index is None:
            split = body.get("split", "train")
            if not isinstance(split, str) or split not in shop.splits.ranges:
                raise ApiError(400, f"field 'split' must be one of {list(shop.splits.ranges)}, got {split!r}")
            index, seed = _int_field(body, "index"), _int_field(body, "seed")
            _require_goals(shop, split)
            if index is None:
                if seed is None:
                    raise ApiError(400, "give 'index' or 'seed' (or 'goal_index')")
                index = random.Random(seed).randrange(shop.splits.size(split))
            try:
                goal_index = shop.splits.goal_index(split, index)
            except ValueError as e:
                raise ApiError(400, str(e)) from None
        try:
            session = shop.create_session(goal_index)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        except ShopFull as e:
            raise ApiError(503, str(e)) from None
        return jsonify(session_view(session, mode)), 201

    @app.get("/api/sessions/<sid>")
    def api_get(sid: str):
        session = session_or_404(sid)
        with session.lock:
            return jsonify(session_view(session, _mode(request.args.get("mode"))))

    @app.post("/api/sessions/<sid>/step")
    def api_step(sid: str):
        session = session_or_404(sid)
        body = _json_body()
        action = body.get("action")
        if not isinstance(action, str):
            raise ApiError(400, "field 'action' must be a string like 'search[red shoes]' or 'click[buy now]'")
        if len(action) > shop.max_query_chars + 20:
            raise ApiError(413, f"action longer than {shop.max_query_chars + 20} characters")
        mode = _mode(body.get("observation_mode"))
        with session.lock:
            result = session.step(action)
            view = session_view(session, mode)
        view.update(valid=result["valid"], message=result["message"])
        return jsonify(view)

    @app.delete("/api/sessions/<sid>")
    def api_delete(sid: str):
        if shop.owner_url(sid) is not None:
            session_or_404(sid)  # redirects
        if not shop.close_session(sid):
            raise ApiError(404, f"unknown or expired session id {sid[:40]!r}")
        return jsonify(closed=True)

    # ----- browser pages (the original URL scheme) ---------------------------------------------------
    def page(session: Session, state: PageState) -> Response:
        with session.lock:
            if session.done:  # a bought session stays on its done page (same rule as ``/<sid>``)
                return Response(session.html, mimetype="text/html")
            try:
                session.set_state(state)
            except LookupError as e:
                raise ApiError(404, str(e)) from None
            except ValueError as e:
                raise ApiError(400, str(e)) from None
            return Response(session.html, mimetype="text/html")

    @app.get("/")
    def home():
        split = request.args.get("split")
        index = request.args.get("index")
        if split is not None or index is not None:
            _require_goals(shop, split or "test")
            try:
                goal_index = shop.splits.goal_index(split or "test", int(index or 0))
            except ValueError as e:
                raise ApiError(400, str(e)) from None
        else:
            goal_index = secrets.randbelow(len(shop.goals))
        try:
            session = shop.create_session(goal_index)
        except ShopFull as e:
            raise ApiError(503, str(e)) from None
        return redirect(f"{shop.session_url or ''}/{session.sid}")

    @app.route("/<sid>", methods=["GET", "POST"])
    def index(sid: str):
        session = session_or_404(sid)
        if request.method == "POST" and "search_query" in request.form:
            query = request.form["search_query"].lower()
            if len(query) > shop.max_query_chars:
                raise ApiError(413, f"search query longer than {shop.max_query_chars} characters")
            keywords = query.split(" ")
            return redirect(Urls(sid, PageState("search_results", keywords, 1)).results)
        if session.done:
            return Response(session.html, mimetype="text/html")
        return page(session, PageState())

    @app.route("/search_results/<sid>/<path:keywords>/<page_no>", methods=["GET", "POST"])
    def search_results(sid: str, keywords: str, page_no: str):
        session = session_or_404(sid)
        return page(session, PageState("search_results", parse_keywords(keywords), parse_page(page_no)))

    @app.route("/item_page/<sid>/<asin>/<path:keywords>/<page_no>/<options>", methods=["GET", "POST"])
    def item_page(sid: str, asin: str, keywords: str, page_no: str, options: str):
        session = session_or_404(sid)
        state = PageState("item_page", parse_keywords(keywords), parse_page(page_no), asin, parse_options(options))
        return page(session, state)

    @app.route("/item_sub_page/<sid>/<asin>/<path:keywords>/<page_no>/<sub_page>/<options>", methods=["GET", "POST"])
    def item_sub_page(sid: str, asin: str, keywords: str, page_no: str, sub_page: str, options: str):
        session = session_or_404(sid)
        if sub_page.lower() not in SUB_PAGES:
            raise ApiError(404, f"unknown sub page {sub_page[:40]!r}; one of {list(SUB_PAGES.values())}")
        state = PageState("item_sub_page", parse_keywords(keywords), parse_page(page_no), asin,
                          parse_options(options), SUB_PAGES[sub_page.lower()])
        return page(session, state)

    @app.route("/done/<sid>/<asin>/<options>", methods=["GET", "POST"])
    def done(sid: str, asin: str, options: str):
        session = session_or_404(sid)
        opts = parse_options(options)
        with session.lock:
            if not session.done:
                try:
                    session.set_state(PageState("item_page", session.state.keywords, session.state.page, asin, opts))
                except LookupError as e:
                    raise ApiError(404, str(e)) from None
                except ValueError as e:
                    raise ApiError(400, str(e)) from None
                session.buy()
            return Response(session.html, mimetype="text/html")

    return app
