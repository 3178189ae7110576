"""A shadow of what every KV slot holds, for the checker's kv_content invariant.

The checker cannot see the KV tensors, but it can know *which* KV each slot must hold: the K/V
written at a position is a function of the token there and of every token before it (attention
mixes in the whole prefix). So each slot's shadow is a chained digest of the token prefix it was
computed for,

    digest(p) = hash((digest(p - 1), token_ids[p]))        digest(-1) = None

set when a step's slot_mapping writes the slot (from the token the step fed in at that position),
and kept until another write lands on the slot: freeing a block does not clear it, exactly as the
real cache keeps the stale K/V. A sequence then reads correct KV at position p exactly when the
slot its block table maps p to holds its own digest(p). That survives prefix hits (the shared block
holds the same digests), eviction (the new owner's writes replace them), preemption and recompute
(the same tokens give the same digests again).

Cost: one hash per written token, and each read is checked a block at a time as a list-slice
comparison (done in C), so a decode step of many long sequences costs well under a millisecond.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BadRead:
    """A position whose slot does not hold the sequence's own prefix."""

    seq_id: int
    position: int
    slot: int
    holds: str  # what the slot holds instead, in words


@dataclass(slots=True)
class KvShadow:
    slots: list = field(default_factory=list)  # slot -> digest of the prefix last written there (None: never)
    digests: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> digest(p) for each known position

    def prefix_digests(self, seq_id: int, tokens: list[int], upto: int) -> list[int]:
        """seq's digest(0 .. upto-1), extended from its tokens as it grows."""
        chain = self.digests.setdefault(seq_id, [])
        for p in range(len(chain), min(upto, len(tokens))):
            chain.append(hash((chain[-1] if chain else None, tokens[p])))
        return chain

    def write(self, seq_id: int, chain: list[int], input_ids, positions, slots) -> None:
        """The step's K/V for one sequence's chunk lands in its slots.

        A token is written as digest((the sequence's own prefix before its position), the token fed
        in): a wrong input id or a position out of the sequence's range gives a digest no correct
        read will match."""
        need = len(self.slots)
        top = max(slots, default=-1)
        if top >= need:
            self.slots.extend([None] * (top + 1 - need))
        for token, pos, slot in zip(input_ids, positions, slots):
            if slot < 0:
                continue
            if 0 <= pos < len(chain) and (pos == 0 or pos - 1 < len(chain)):
                self.slots[slot] = hash((chain[pos - 1] if pos > 0 else None, token))
            else:
                self.slots[slot] = ("out of range", seq_id, pos)

    def bad_reads(self, seq_id: int, chain: list[int], block_table, seq_len: int, block_size: int) -> Iterator[BadRead]:
        """Positions 0 .. seq_len-1 read through block_table whose slot lacks the sequence's own digest.

        Yields at most one BadRead (the first), since one wrong position spoils the rest."""
        shadow = self.slots
        for j, block in enumerate(block_table):
            start = j * block_size
            if start >= seq_len:
                return
            n = min(block_size, seq_len - start)
            base = block * block_size
            got = shadow[base : base + n]
            want = chain[start : start + n]
            if got == want:
                continue
            for k in range(n):
                if k >= len(got) or k >= len(want) or got[k] != want[k]:
                    holds = got[k] if k < len(got) else None
                    yield BadRead(seq_id, start + k, base + k, self.describe(holds, start + k))
                    return

    def describe(self, digest, position: int) -> str:
        """What a slot holds, in words: whose prefix, if any sequence's."""
        if digest is None:
            return "no KV at all (it was never written)"
        if isinstance(digest, tuple):
            return f"KV written for seq {digest[1]}'s position {digest[2]}, outside its tokens"
        for sid, chain in self.digests.items():
            if position < len(chain) and chain[position] == digest:
                return f"the KV of seq {sid}'s prefix at position {position}"
            if digest in chain:
                return f"the KV of seq {sid}'s position {chain.index(digest)}"
        return "KV computed for a different token prefix"

    def forget(self, seq_id: int) -> None:
        """A finished sequence reads no more; its slots keep their digests."""
        self.digests.pop(seq_id, None)
