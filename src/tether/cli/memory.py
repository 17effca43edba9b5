"""``tether forget`` and ``tether knowledge add|search``: the memory commands.

They go through :class:`~tether.memory.service.MemoryService`, never the store's own calls, so
forgetting and indexing mean the same here as over HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tether.cli._options import DataDirOpt, KeyOpt, StoreOpt, UrlOpt
from tether.cli._output import err, errors, fail, out
from tether.cli._store import forget_user, on_store, workspaces_of
from tether.errors import TetherError

if TYPE_CHECKING:
    from tether.store.protocol import Store

knowledge_app = typer.Typer(
    help="Add documents to knowledge collections and search them.", no_args_is_help=True
)

# Tenants a user can have data in without saying so: API keys default to "default", embedded
# use (Agent.chat, Session) is "local".
_IMPLICIT_TENANTS = ("default", "local")
TenantOpt = Annotated[
    str | None,
    typer.Option(help="The user's tenant (default: both 'default' and embedded 'local')."),
]


def forget(
    user: Annotated[
        str | None, typer.Option(help="Forget this user (local store; needs no --url).")
    ] = None,
    tenant: TenantOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Delete everything of a user: sessions, history, memory, knowledge, embeddings.

    On the local store give --user; against a server (--url) it forgets the key's own user.
    """
    with errors():
        if url:
            if user:
                raise fail(
                    "--user works on the local store; with --url the key's user is forgotten"
                )
            from tether.client import Client

            with Client(url, api_key=key) as client:
                report = client.request("DELETE", "/v1/users/me/data")
            out.print(
                f"forgot: {report['sessions']} sessions, {report['memory']} memory items and "
                f"chunks, {report['documents']} documents"
            )
            return
        if not user:
            raise fail("say whose data to forget: --user USER")
        tenants = (tenant,) if tenant else _IMPLICIT_TENANTS
        if not yes and not typer.confirm(
            f"Delete all data of user {user!r} in tenant(s) {', '.join(tenants)}?"
        ):
            raise typer.Exit(1)

        root = workspaces_of(data_dir)
        reports = on_store(data_dir, store, lambda s: forget_user(s, tenants, user, root))
    for t, report in zip(tenants, reports, strict=True):
        out.print(
            f"{t}/{user}: forgot {report.sessions} sessions, {report.memory} memory items and "
            f"chunks, {report.documents} documents"
        )


KNOWN_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".html", ".htm", ".pdf")


@knowledge_app.command("add")
def knowledge_add(
    paths: Annotated[list[Path], typer.Argument(help="Files or directories (searched deeply).")],
    collection: Annotated[str, typer.Option(help="The collection to add to.")] = "knowledge",
    scope: Annotated[str, typer.Option(help="user, agent or tenant.")] = "user",
    agent: Annotated[str | None, typer.Option(help="The agent, for --scope agent.")] = None,
    user: Annotated[
        str, typer.Option(help="Whose knowledge (local store; 'local' is embedded use's user).")
    ] = "local",
    tenant: Annotated[
        str,
        typer.Option(
            help="The tenant (local store): 'local' for embedded use, 'default' for API keys "
            "created without --tenant."
        ),
    ] = "local",
    url: UrlOpt = None,
    key: KeyOpt = None,
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Index text, Markdown, HTML and PDF files into a knowledge collection, with progress."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from tether.memory.knowledge import check_collection

    # Options are checked once, before any file is read.
    with errors():
        check_collection(collection)
    if scope not in ("user", "agent", "tenant"):
        raise fail("--scope must be user, agent or tenant")
    if scope == "agent" and not agent:
        raise fail("--scope agent needs --agent NAME")
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(
                f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in KNOWN_SUFFIXES
            )
        elif path.is_file():
            files.append(path)
        else:
            raise fail(f"no such file or directory: {path}")
    if not files:
        raise fail("no .txt, .md, .html or .pdf files found")
    added, failed = 0, 0
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err
    )

    def report_failure(f: Path, exc: Exception) -> None:
        nonlocal failed
        failed += 1
        progress.console.print(f"[yellow]skipped[/] {f}: {exc}")

    with errors(), progress:
        overall = progress.add_task("documents", total=len(files))
        if url:
            from tether.client import Client

            with Client(url, api_key=key, timeout=300) as client:
                for f in files:
                    fields = {"scope": scope, **({"agent": agent} if agent else {})}
                    try:
                        client.request(
                            "POST",
                            f"/v1/knowledge/{collection}/documents",
                            files={"file": (f.name, f.read_bytes())},
                            data=fields,
                        )
                        added += 1
                    except TetherError as exc:
                        report_failure(f, exc)
                    progress.advance(overall)
        else:

            async def go(s: Store) -> None:
                nonlocal added
                from tether.memory.service import MemoryService
                from tether.records import Principal

                service = MemoryService(s)
                principal = Principal(tenant, user, frozenset({"admin"}))
                chunks = progress.add_task("chunks", total=None)
                for f in files:
                    progress.update(chunks, description=f"chunks of {f.name}", completed=0)
                    try:
                        await service.add_document(
                            principal,
                            collection,
                            f.read_bytes(),
                            name=f.name,
                            scope=scope,
                            agent=agent,
                            progress=lambda done, total: progress.update(
                                chunks, completed=done, total=total
                            ),
                        )
                        added += 1
                    except (TetherError, OSError) as exc:
                        report_failure(f, exc)
                    progress.advance(overall)

            on_store(data_dir, store, go)
    out.print(
        f"added {added} of {len(files)} documents to {collection!r}"
        + (f" ({failed} skipped)" if failed else "")
    )
    if failed and not added:
        raise typer.Exit(1)


@knowledge_app.command("search")
def knowledge_search(
    query: str,
    collection: Annotated[str, typer.Option(help="The collection to search.")] = "knowledge",
    limit: Annotated[int, typer.Option(help="At most this many passages.")] = 5,
    agent: Annotated[str | None, typer.Option(help="Include this agent's collection.")] = None,
    user: Annotated[str, typer.Option(help="Whose knowledge (local store).")] = "local",
    tenant: Annotated[str, typer.Option(help="The user's tenant (local store).")] = "local",
    data_dir: DataDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Search a knowledge collection of the local store."""

    async def go(s: Store) -> list[Any]:
        from tether.memory.service import MemoryService
        from tether.records import Principal

        service = MemoryService(s)
        principal = Principal(tenant, user)
        namespaces = service.readable(principal, agent=agent)
        return await service.search_knowledge(namespaces, query, [collection], limit=limit)

    with errors():
        hits = on_store(data_dir, store, go)
    if not hits:
        out.print("no passage matched")
    for h in hits:
        where = h.record.meta.get("document", "?")
        if "page" in h.record.meta:
            where += f" p.{h.record.meta['page']}"
        out.print(f"[bold]{where}[/] ({h.score:.4f})\n{h.record.content}\n")
