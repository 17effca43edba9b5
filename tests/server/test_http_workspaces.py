"""Over HTTP, a session's workspace goes with it: ``DELETE /v1/sessions/{sid}`` removes it, and
``DELETE /v1/sessions/{sid}/items?workspace=true`` clears it with the history."""

from __future__ import annotations

from pathlib import Path

from tests.server.conftest import Server
from tether.records import LOCAL_PRINCIPAL, SessionKey
from tether.tools.workspace import ensure_workspace, workspace_dir


def _planted(server: Server, sid: str) -> Path:
    """A file in the session's workspace, as a tool would have left it."""
    key = SessionKey(LOCAL_PRINCIPAL.tenant, LOCAL_PRINCIPAL.user, sid)
    ws = ensure_workspace(workspace_dir(server.data_dir / "workspaces", key))
    (ws / "made-by-a-tool.txt").write_text("x")
    return ws


def test_delete_and_clear_take_the_workspace_along(server: Server) -> None:
    with server.client() as c:
        for sid in ("ws-del", "ws-clear", "ws-keep"):
            assert c.post("/v1/sessions", json={"agent": "echo", "session_id": sid}).is_success
        deleted, cleared, kept = (_planted(server, s) for s in ("ws-del", "ws-clear", "ws-keep"))

        assert c.delete("/v1/sessions/ws-del").status_code == 204
        assert not deleted.exists()

        assert c.delete("/v1/sessions/ws-clear/items").status_code == 204
        assert cleared.exists()  # history only, by default
        assert (
            c.delete("/v1/sessions/ws-clear/items", params={"workspace": "true"}).status_code == 204
        )
        assert not cleared.exists()
        assert c.get("/v1/sessions/ws-clear").status_code == 200

        assert (kept / "made-by-a-tool.txt").exists()
        # Someone else's session id is a 404 and removes nothing.
        assert (
            c.delete("/v1/sessions/ws-unknown/items", params={"workspace": "true"}).status_code
            == 404
        )
