"""A template whose holes' lengths are bounds, on the server: one engine request per hole, left to
right (unmask.holes.Template.round, as LLM.infill decodes it), forwarded to the completion as one
request's updates over the whole region, so its text stream and usage are a template's."""

import asyncio
from dataclasses import replace

from unmask import holes as holes_
from unmask.errors import UnmaskError
from unmask.server.async_engine import QueueFull


class _Rounds:
    """A template's engine requests, one per hole (holes whose lengths are bounds), as one
    request: forwards and counters summed, the prompt's cached tokens those of the first."""

    def __init__(self) -> None:
        self.parts: list = []

    nfe = property(lambda self: sum(r.nfe for r in self.parts))
    cached_tokens = property(lambda self: self.parts[0].cached_tokens if self.parts else 0)
    finish_reason = property(lambda self: self.parts[-1].finish_reason if self.parts else None)

    def counters(self) -> dict:
        out: dict = {}
        for r in self.parts:
            for k, v in r.counters().items():
                out[k] = out.get(k, 0) + v
        return out


class HoleRounds:
    """Completion's hole-by-hole decode (mixed in): `template`, `rounds` (the parameters the
    template was given), `names` / `live`, `streams`, `holes`, `engine`, `merged`, `forwarders`
    and `diffusing` are the completion's."""

    def _submit_rounds(self) -> None:
        """A template of bounded holes: each choice's first hole now (a full queue is a 429), the
        next ones as each finishes (_forward_rounds)."""
        self._start(lambda i: self._round(i, 0, []), self._forward_rounds)

    def _round(self, i: int, h: int, filled: list[list[int]]) -> asyncio.Queue:
        rt = self.template.round(h, filled)
        llm = self.streams[0].llm
        params = llm.template_params(self.rounds, rt)
        if params.seed is not None:
            params = replace(params, seed=params.seed + i)
        self.live[i] = f"{self.names[i]}-h{h}"
        extra = {k: v for k, v in self.holes.items() if k not in ("suffix", "fill")}
        return self.engine.submit(self.live[i], rt.prompt, params, watch=self.diffusing, suffix=rt.suffix, **extra)

    async def _forward_rounds(self, i: int, q: asyncio.Queue) -> None:
        """Choice i's holes one after another, forwarded as one request's updates over the whole
        region: each hole's committed ids in its place, then (once it finishes) end-of-text padding
        up to its bound and the fixed text after it; the request's counters are the holes' summed."""
        t, stops = self.template, set(self.streams[0].stop_ids)
        eos = self.streams[0].llm.token_ids.stop[0]
        whole, filled, written = _Rounds(), [], []
        for h, (s, e) in enumerate(t.holes):
            if h:
                try:
                    q = self._round(i, h, filled)
                except (QueueFull, UnmaskError) as err:
                    await self.merged.put((i, err))
                    return
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    await self.merged.put((i, item))
                    return
                if item is None:
                    break
                if not whole.parts or whole.parts[-1] is not item.request:
                    whole.parts.append(item.request)
                written += item.new_ids
                new = list(item.new_ids)
                last = item.finished and h == len(t.holes) - 1
                if item.finished:  # this hole's text, the padding up to its bound, the text after it
                    filled.append(holes_.cut_hole(t, h, written, stops, holes_.ends_at_suffix(self.rounds))[0])
                    new += [eos] * (e - s - len(written)) + t.region[e : t.holes[h + 1][0] if not last else e]
                    written = []
                await self.merged.put((i, replace(item, request=whole, new_ids=new, finished=last)))
            if not filled or len(filled) <= h:  # aborted before it finished
                await self.merged.put((i, None))
                return
        await self.merged.put((i, None))

