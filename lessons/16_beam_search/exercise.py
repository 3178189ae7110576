"""Lesson 16: one request, many sequences. Write fork and copy_on_write.

Check it:  nanoengine lesson check 16
Watch it:  nanoengine lesson trace 16
"""

from __future__ import annotations

from nanoengine.sequence import Sequence


def fork(self, parent: Sequence, child: Sequence) -> None:
    """The child beam shares every block of its parent: no K/V is copied.

    self is the BlockManager. child comes from parent.fork(): the parent's
    tokens and counters, an empty block_table. Give the child its own list
    of the parent's block ids, raise each block's ref count by one (in
    self.ref_counts), and give it the parent's block_hashes too.
    """
    # TODO: share the blocks; one more holder for each.
    raise NotImplementedError("fork is not written yet")


def copy_on_write(self, seq: Sequence) -> tuple[int, int] | None:
    """Before seq writes into a shared block, give it a copy of its own.

    seq writes its next token into block index seq.num_cached_tokens //
    self.block_size of its table (that index may not exist yet: then nothing
    is shared). When that block's ref count is above 1, take a free block
    (self.take_free_block()), put it at that index of seq.block_table, lower
    the source block's ref count by one and return (source, copy): the
    runner copies the source's K/V into the copy before the step writes.
    Otherwise change nothing and return None. (self.must_copy(seq) tells
    whether the block is shared.)
    """
    # TODO: copy the one block seq writes next, if it is shared.
    raise NotImplementedError("copy_on_write is not written yet")
