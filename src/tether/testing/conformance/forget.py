"""Forgetting a user: every session and private memory of theirs goes, nothing of anyone else's.

Shared memory (the agent's, the tenant's) stays even where the user wrote it; the same user id in
another tenant is another person; and a forgotten user may start again.
"""

from __future__ import annotations

from tether.records import ForgetReport, NewItem, SessionKey
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    AGENT,
    ALICE,
    ALICE_ELSEWHERE,
    ALICE_S1,
    BOB,
    BOB_S1,
    TENANT,
    add_doc,
    ev,
    key,
    new_session,
    put,
    running_turn,
    version,
)


class ForgetConformance:
    """Forgetting a user removes exactly their sessions, memory and documents.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_forget_user(self, store: Store) -> None:
        alice_s1, alice_s2 = key("s1"), key("s2")
        bob_s1, elsewhere_s1 = key("s1", owner="bob"), key("s1", tenant="globex")

        def turn(k: SessionKey) -> str:
            return f"t-{k.tenant}-{k.owner}-{k.session_id}"  # turn ids are unique store-wide

        for k in (alice_s1, alice_s2, bob_s1, elsewhere_s1):
            await new_session(store, k)
            lease = await running_turn(store, k, turn(k))
            await store.append(lease, turn(k), [NewItem("assistant", "hi")], [ev(3)])

        await put(store, ALICE, "a-user", "alice fact")
        await put(store, ALICE_S1, "a-sess", "alice session note")
        await add_doc(store, ALICE, "a-doc", "notes", chunks=2)
        shared = [
            await put(store, AGENT, "agent-rule", meta={"author": "alice"}),
            await put(store, TENANT, "tenant-fact", meta={"author": "alice"}),
        ]
        bobs = [await put(store, BOB, "b-user"), await put(store, BOB_S1, "b-sess")]
        elsewhere = await put(store, ALICE_ELSEWHERE, "e-user", "alice fact")
        e_doc, e_chunks = await add_doc(store, ALICE_ELSEWHERE, "e-doc", "notes", chunks=1)
        versions = {ns: await version(store, ns) for ns in (ALICE, ALICE_S1)}
        notes_version = await version(store, ALICE, "notes")

        report = await store.forget_user("acme", "alice")
        assert report == ForgetReport(sessions=2, memory=4, documents=1)

        for k in (alice_s1, alice_s2):
            assert await store.get_session(k) is None
            assert await store.get_turn(k, turn(k)) is None
            assert await store.list_events(k, turn(k)) == []
        assert await store.list_sessions("acme", "alice") == []
        for record_id in ("a-user", "a-sess", "a-doc-0", "a-doc-1"):
            assert await store.locate_memory(record_id) is None
        assert await store.list_memory([ALICE, ALICE_S1]) == []
        assert await store.list_memory([ALICE], collection="notes") == []
        assert await store.list_documents(ALICE) == []
        assert (await store.load_vectors(ALICE, collection="notes")).seqs == []
        found = await store.lexical_search(
            [ALICE, ALICE_S1], collection="", terms=["alice"], limit=9
        )
        assert found == []
        for ns, before in versions.items():
            assert await version(store, ns) != before
        assert await version(store, ALICE, "notes") != notes_version

        # Shared memory stays, and so does everyone else's data.
        assert await store.list_memory([AGENT, TENANT]) == shared
        assert await store.list_memory([BOB, BOB_S1]) == bobs
        assert [i.content for i in await store.list_items(bob_s1)] == ["hello", "hi"]
        assert [i.content for i in await store.list_items(elsewhere_s1)] == ["hello", "hi"]
        assert await store.list_memory([ALICE_ELSEWHERE]) == [elsewhere]
        assert await store.list_memory([ALICE_ELSEWHERE], collection="notes") == e_chunks
        assert await store.list_documents(ALICE_ELSEWHERE) == [e_doc]

        assert await store.forget_user("acme", "alice") == ForgetReport()
        # Forgotten is not banned: the user can start again.
        await new_session(store, alice_s1)
        again = await put(store, ALICE, "a-user", "new fact")
        assert await store.list_memory([ALICE]) == [again]
