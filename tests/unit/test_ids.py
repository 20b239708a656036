"""Job ids are UUIDv7, increasing within a process, one at a time or a batch at once, as UUID or text (SPEC Z4)."""

from __future__ import annotations

import threading
import uuid

from brooq_py.queue.ids import uuid7, uuid7_text, uuid7_texts


def test_z4_single_and_batch_ids_are_uuidv7_and_increase_together() -> None:
    ids = [uuid7()]
    for n in (1, 0, 1000, 3):
        batch = uuid7_texts(n)
        assert len(batch) == n
        ids += [uuid.UUID(t) for t in batch]
        assert [str(uuid.UUID(t)) for t in batch] == batch  # canonical text
        ids.append(uuid7())
        text = uuid7_text()
        assert str(uuid.UUID(text)) == text
        ids.append(uuid.UUID(text))
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_z4_batches_from_threads_never_collide() -> None:
    out: list[list[str]] = []
    lock = threading.Lock()

    def make() -> None:
        for _ in range(20):
            batch = uuid7_texts(50)
            with lock:
                out.append(batch)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for batch in out for i in batch]
    assert len(set(flat)) == len(flat) == 4 * 20 * 50
    assert all(batch == sorted(batch, key=uuid.UUID) for batch in out)
