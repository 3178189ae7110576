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
(the same tokens give the same digests again), and a beam search's copy-on-write: a step's copies
(blocks_to_copy) are applied before its writes, as the runner copies the K/V before the forward. A
beam search restarted from its prompt has its chain cut back with its tokens (cut).

A trace that starts on an engine that already ran (a warmed-up bench engine: its first step number
is not 0) may read KV written before the recording began. Those slots start UNKNOWN, and the first
sequence that reads one defines what it holds (trust on first use); every later read must agree.

Cost: one hash per written token; reads are compared a whole block at a time (two lists compared
in C), so a decode step of 32 sequences of a few hundred tokens costs a fraction of a millisecond.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

UNKNOWN = "written before the trace began"


@dataclass(frozen=True, slots=True)
class BadRead:
    """A position whose slot does not hold the sequence's own prefix."""

    seq_id: int
    position: int
    slot: int
    holds: str  # what the slot holds instead, in words


@dataclass(slots=True)
class KvShadow:
    block_size: int = 0
    blocks: list[list] = field(default_factory=list)  # block -> each slot's prefix digest (None: never written)
    # seq_id -> its digests, a list per block; kept after it finishes, to name whose KV a slot holds
    chains: dict[int, list[list[int]]] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)  # block -> how many slot writes it has had
    # seq_id -> (its first full blocks, their versions) when their reads were last found good
    verified: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)

    def start(self, num_kv_blocks: int, block_size: int, fresh_engine: bool) -> None:
        """Size the shadow at the first step; an engine that ran before the trace has UNKNOWN slots."""
        self.block_size = block_size
        self.blocks = [[None if fresh_engine else UNKNOWN] * block_size for _ in range(num_kv_blocks)]
        self.versions = [0] * num_kv_blocks

    def chain(self, seq_id: int, tokens: list[int], upto: int) -> list[list[int]]:
        """seq's digest(0 .. upto-1), grouped by block, extended from its tokens as it grows."""
        bs = self.block_size
        chain = self.chains.setdefault(seq_id, [])
        have = (len(chain) - 1) * bs + len(chain[-1]) if chain else 0
        last = chain[-1][-1] if chain else None
        for p in range(have, min(upto, len(tokens))):
            last = hash((last, tokens[p]))
            if p % bs == 0:
                chain.append([])
            chain[-1].append(last)
        return chain

    def copy(self, source: int, copy: int) -> None:
        """Copy-on-write: block copy gets source's K/V, as the runner copies it before the forward."""
        if source != copy and 0 <= source < len(self.blocks) and 0 <= copy < len(self.blocks):
            self.blocks[copy] = list(self.blocks[source])
            self.versions[copy] += 1

    def cut(self, seq_id: int, num_tokens: int) -> None:
        """seq's tokens were cut back to num_tokens (a beam search restarted): its digests past them go,
        so the tokens it computes again are chained afresh."""
        chain, bs = self.chains.get(seq_id), self.block_size
        if chain is None or bs <= 0:
            return
        del chain[(num_tokens + bs - 1) // bs :]
        if chain and num_tokens % bs:
            del chain[-1][num_tokens % bs :]
        self.verified.pop(seq_id, None)

    def digest_at(self, chain: list[list[int]], position: int):
        bs = self.block_size
        j, k = divmod(position, bs)
        return chain[j][k] if 0 <= position and j < len(chain) and k < len(chain[j]) else None

    def write(self, seq_id: int, chain: list[list[int]], input_ids, positions, slots) -> None:
        """The step's K/V for one sequence's chunk lands in its slots.

        A token is written as digest(the sequence's own prefix before its position, the token fed
        in): a wrong input id, or a position past the sequence's tokens, gives a digest that no
        correct read will match."""
        bs, blocks = self.block_size, self.blocks
        for token, pos, slot in zip(input_ids, positions, slots):
            b, k = divmod(slot, bs)
            if not 0 <= b < len(blocks):
                continue  # outside the pool: pool_shape and slot_mapping report it
            self.versions[b] += 1
            if pos == 0:
                blocks[b][k] = hash((None, token))
            elif self.digest_at(chain, pos - 1) is not None:
                blocks[b][k] = hash((self.digest_at(chain, pos - 1), token))
            else:
                blocks[b][k] = ("out of range", seq_id, pos)

    def bad_reads(
        self, seq_id: int, chain: list[list[int]], block_table: Sequence[int], seq_len: int
    ) -> Iterator[BadRead]:
        """Positions 0 .. seq_len-1 read through block_table whose slot lacks the sequence's own digest.

        Yields at most one BadRead (the first), since one wrong position spoils every later one.
        Full blocks found good before, and not written since, are not compared again."""
        bs, blocks = self.block_size, self.blocks
        first = self.unchanged_prefix(seq_id, block_table)
        for j, block in enumerate(block_table[first:], first):
            start = j * bs
            if start >= seq_len or j >= len(chain):
                break
            if not 0 <= block < len(blocks):
                return  # outside the pool: pool_shape reports it
            got, want = blocks[block], chain[j]
            n = min(bs, seq_len - start)
            if (got == want) if n == bs == len(want) else (got[:n] == want[:n]):
                continue
            for k in range(min(n, len(want))):
                if got[k] == want[k]:
                    continue
                if got[k] is UNKNOWN:
                    got[k] = want[k]  # the first reader of pre-trace KV defines it
                    continue
                yield BadRead(seq_id, start + k, block * bs + k, self.describe(got[k], start + k))
                return
        full = tuple(block_table[: min(seq_len // bs, len(chain))])
        self.verified[seq_id] = (full, tuple(map(self.versions.__getitem__, full)))

    def unchanged_prefix(self, seq_id: int, block_table: Sequence[int]) -> int:
        """How many leading blocks of block_table were found good and have not been written since."""
        full, versions = self.verified.get(seq_id, ((), ()))
        if not full or tuple(block_table[: len(full)]) != full:
            return 0
        return len(full) if tuple(map(self.versions.__getitem__, full)) == versions else 0

    def describe(self, digest, position: int) -> str:
        """What a slot holds, in words: whose prefix, if any sequence's of this trace."""
        if digest is None:
            return "no KV at all (it was never written)"
        if isinstance(digest, tuple):
            return f"KV written for seq {digest[1]}'s position {digest[2]}, past its tokens"
        for sid, chain in self.chains.items():
            if self.digest_at(chain, position) == digest:
                return f"the KV of seq {sid}'s prefix at position {position}"
            for j, block in enumerate(chain):
                if digest in block:
                    return f"the KV of seq {sid}'s position {j * self.block_size + block.index(digest)}"
        return "KV computed for a different token prefix"
