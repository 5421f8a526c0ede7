"""One constrained request's grammar state (RowGrammar): the validated prefix, the plan that
completes it within the room left on the canvas, and the checks a step's proposals pass at the
frontier (constrain/grammar.py's module docstring says why the plan makes a fixed-length canvas
safe). Made by GrammarVocab.row."""

import torch

from unmask.constrain.spec import Constraint
from unmask.errors import UnmaskError


class RowGrammar:
    """One constrained request's grammar state (see the module docstring). `length`: the answer's
    canvas (gen_length tokens): the plan made here must fit it, else the constraint is refused.
    `vocab`: the model's GrammarVocab (constrain/grammar.py), which makes its rows."""

    def __init__(self, vocab, constraint: Constraint, length: int) -> None:
        self.vocab, self.constraint = vocab, constraint
        self.m = vocab.matcher(vocab.compile(constraint))
        self.front = 0  # the frontier: the answer's first column not yet checked (set when its row starts)
        self.finished = False  # an end of text was accepted: the rest of the canvas is end of text
        self.forced = 0  # frontier tokens replaced by the plan's (room), for the stats
        self.rejected = 0  # committed tokens the grammar (or the room) rejected, masked again
        plan = vocab.complete(self.m, length, tries=16)
        if plan is None:
            allowed = vocab.allowed(self.m)[: vocab.n_text]  # (an empty language leaves llguidance in error)
            if self.m.is_error() or (not allowed[[i for i in range(vocab.n_text) if i not in vocab.stop]].any()
                                     and not self.m.is_accepting()):
                raise UnmaskError(f"{constraint.describe()}: matches nothing this {vocab.kind} tokenizer can write "
                                  "(no text of this vocabulary starts a word of the language)", param=constraint.kind)
            longer = max(4 * length, 256)
            room = vocab.complete(self.m, longer, tries=16)  # is it the length, or the vocabulary?
            if room is None:
                raise UnmaskError(f"{constraint.describe()}: this {vocab.kind} tokenizer's text starts words of the "
                                  f"language but completes none within {longer} tokens: it cannot write some text the "
                                  "language needs", param=constraint.kind)
            raise UnmaskError(f"{constraint.describe()}: no completion within gen_length {length} tokens; one "
                              f"of {len(room)} tokens exists: raise gen_length to at least that",
                              param=constraint.kind)
        self.plan = plan

    def copy(self) -> "RowGrammar":
        """A fresh state for another request with the same constraint and length (its own matcher)."""
        out = object.__new__(RowGrammar)
        out.__dict__.update(self.__dict__, m=self.m.deep_copy(), plan=list(self.plan))
        return out

    def verify(self, logits: torch.Tensor, drafts: list[int], room: int) -> list[int]:
        """Speculative rows: the tokens an autoregressive target writes under this grammar from
        `logits` ((k, V): position j scores the token after the j-th block token, the drafts
        `drafts` being the block's tokens 1..k-1): at each position the argmax of the logits the
        grammar allows, checked as `advance` checks it (the plan's token when no room is left),
        then the next position only if the draft there is that token. The grammar state moves
        past the tokens returned (1 to k). `room`: positions left before the first of them."""
        out = []
        vocab = self.vocab
        for j in range(logits.shape[0]):
            if self.finished:  # after the end of text: end of text
                t = self.vocab.stop[0]
            else:
                bitmask = vocab.bitmask(1)
                vocab.fill([self.m], bitmask)
                ok = vocab.unpack(bitmask, logits.shape[-1])[0].to(logits.device)
                t = int(torch.where(ok, logits[j].float(), -torch.inf).argmax())
                keep, _ = self.advance([t], room - j)
                t = keep[0]
            out.append(t)
            if j >= len(drafts) or drafts[j] != t or t in vocab.stop:
                break
        return out

    def advance(self, run: list[int], room: int) -> tuple[list[int], bool]:
        """Check the committed tokens `run` that follow the validated prefix (the first at the
        frontier), with `room` positions from the frontier to the canvas's end. Returns (keep,
        remask): the tokens now validated (run's first ones, but the first may be replaced by the
        plan's token when it leaves no room: the frontier always advances when `run` is
        non-empty), and whether the position after them is masked again (a token the grammar or
        the room rejects)."""
        if self.finished or not run:
            return [], False
        m, stop, keep = self.m, self.vocab.stop, []
        for t in run:
            if t in stop:
                if m.is_accepting():
                    m.consume_token(t)
                    keep.append(t)
                    self.finished = True
                break
            if t >= self.vocab.n_text or m.try_consume_tokens([t]) != 1:
                break
            keep.append(t)
        n = len(keep)
        if n and not self.finished:  # the room: the new prefix must still be completable in what is left
            plan = self.plan[n:] if keep == self.plan[:n] else self.vocab.complete(m, room - n)
            while plan is None and n:
                m.rollback(1)
                n -= 1
                plan = self.plan[n:] if keep[:n] == self.plan[:n] else self.vocab.complete(m, room - n)
            keep = keep[:n]
            self.plan = plan
        if not keep:  # the frontier's token is rejected: the plan's next token takes its place
            t = self.plan[0] if self.plan else stop[0]
            m.consume_token(t)
            self.finished = t in stop
            self.plan = self.plan[1:]
            self.forced += 1
            remask = len(run) > 1 and not self.finished  # the run's next token is checked after a mask
            self.rejected += remask
            return [t], remask
        remask = len(keep) < len(run) and not self.finished
        self.rejected += remask
        return keep, remask
