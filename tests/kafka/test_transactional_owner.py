"""The owner file of a transactional id: who of this machine took the id over last."""

from __future__ import annotations

from pathlib import Path

from kafka_changelog.kafka.transactional_owner import TransactionalIdOwner


def test_a_later_claim_takes_the_id_over_from_an_earlier_one(tmp_path: Path) -> None:
    first = TransactionalIdOwner("127.0.0.1:9092", "app-op-0", tmp_path)
    second = TransactionalIdOwner("127.0.0.1:9092", "app-op-0", tmp_path)
    assert not first.taken_over()  # never claimed: nothing to lose
    first.claim()
    assert not first.taken_over()
    second.claim()
    assert first.taken_over() and not second.taken_over()
    first.claim()  # took it back
    assert not first.taken_over() and second.taken_over()
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]  # no partial file left


def test_other_ids_and_clusters_have_files_of_their_own(tmp_path: Path) -> None:
    owners = [TransactionalIdOwner("a:9092", "t-0", tmp_path),
              TransactionalIdOwner("a:9092", "t-1", tmp_path),
              TransactionalIdOwner("b:9092", "t-0", tmp_path)]
    for owner in owners:
        owner.claim()
    assert not any(owner.taken_over() for owner in owners)
    assert len({owner.path for owner in owners}) == 3


def test_an_unwritable_directory_only_loses_the_hint(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    owner = TransactionalIdOwner("127.0.0.1:9092", "t", blocked)
    owner.claim()
    assert not owner.taken_over()


def test_a_removed_file_is_not_a_take_over(tmp_path: Path) -> None:
    owner = TransactionalIdOwner("127.0.0.1:9092", "t", tmp_path)
    owner.claim()
    owner.path.unlink()
    assert not owner.taken_over()
