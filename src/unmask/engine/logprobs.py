"""logprobs of a row kind's requests: each generated token's log-probability (and the most likely
tokens' beside it) stored at its canvas column when it is written, and read for the tokens a step
reports (engine/kind.py Report.logprobs), in one transfer per step while such rows run.

The value stays with the column: a token that a revising policy edits, or that structured
output's check replaces, is scored again by the forward that wrote it; a token masked again is
scored when it is committed anew. What each kind scores with: sampler/logprobs.py."""

import torch

from unmask.sampler.logprobs import TOP_LOGPROBS, token_logprobs

Entry = tuple[float, list[tuple[int, float]]]  # (the token's logprob, [(id, logprob)] of the most likely)


class Logprobs:
    def __init__(self, rows) -> None:
        self.rows = rows  # engine/rows.py Rows: its lazy lp, top_ids, top_lp fields
        self.count = 0  # running rows that asked for logprobs
        self.top = 0  # of those, rows that asked for the most likely tokens too

    def admit(self, reqs: list) -> None:
        self.count += sum(q.logprobs is not None for q in reqs)
        self.top += sum(bool(q.logprobs) for q in reqs)
        if self.count:
            self.rows.allocate_cols("lp")
        if self.top:
            self.rows.allocate_cols("top_ids", (TOP_LOGPROBS,))
            self.rows.allocate_cols("top_lp", (TOP_LOGPROBS,))

    def remove(self, reqs: list) -> None:
        self.count -= sum(q.logprobs is not None for q in reqs)
        self.top -= sum(bool(q.logprobs) for q in reqs)

    def record(self, idx: torch.Tensor, cols: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor,
               where: torch.Tensor) -> None:
        """Rows `idx`' columns `cols` (B, W) now hold `tokens` (B, W), chosen from `logits`
        (B, W, V): store their scores where `where` (B, W) (the columns written)."""
        if not self.count:
            return
        r = self.rows
        lp, ids, tlp = token_logprobs(logits, tokens, TOP_LOGPROBS if self.top else 0)
        rows = idx[:, None].expand_as(cols)
        r.lp[rows[where], cols[where]] = lp[where]
        if ids is not None:
            r.top_ids[rows[where], cols[where]] = ids[where]
            r.top_lp[rows[where], cols[where]] = tlp[where]

    def attach(self, report) -> None:
        """Report.logprobs for the reported rows that asked: the scores of their new ids (the
        committed answer's last len(new_ids) tokens, after the prompt in the row's canvas)."""
        if not self.count:
            return
        r = self.rows
        spans = []
        for k, i in enumerate(report.rows):
            req, new = r.reqs[i], report.new_ids[k]
            if req.logprobs is None or not new:
                continue
            end = len(req.prompt) + report.committed[k]
            spans.append((i, end - len(new), end, req.logprobs))
        if spans:
            report.logprobs.update(read(r.lp, r.top_ids, r.top_lp, spans))


def read(lp: torch.Tensor, top_ids: torch.Tensor | None, top_lp: torch.Tensor | None, spans: list) -> dict:
    """{row: [Entry]} for spans (row, first column, end column, top count) of (n, C) scores and
    (n, C, K) most likely tokens, in one transfer (two with the most likely tokens)."""
    dev = lp.device
    rows = torch.tensor([i for i, a, b, _ in spans for _ in range(a, b)], dtype=torch.long, device=dev)
    cols = torch.tensor([c for _, a, b, _ in spans for c in range(a, b)], dtype=torch.long, device=dev)
    vals = lp[rows, cols].tolist()
    tops = None
    if top_ids is not None and any(k for *_, k in spans):
        tops = torch.stack([top_ids[rows, cols].float(), top_lp[rows, cols]], -1).tolist()  # ids exact below 2**24
    out, at = {}, 0
    for i, a, b, k in spans:
        out[i] = [(vals[at + j], [] if not k else [(int(t), v) for t, v in tops[at + j][:k]]) for j in range(b - a)]
        at += b - a
    return out
