"""GET /metrics: the engine's counters and histograms in Prometheus' text format."""

from unmask.server.async_engine import AsyncEngine


def prometheus(engine: AsyncEngine) -> str:
    m = engine.metrics
    lines = [
        "# HELP unmask_requests_running Requests in the running batch.", "# TYPE unmask_requests_running gauge",
        f"unmask_requests_running {engine.num_running}",
        "# HELP unmask_requests_waiting Requests queued.", "# TYPE unmask_requests_waiting gauge",
        f"unmask_requests_waiting {engine.num_waiting}",
        "# HELP unmask_requests_total Requests that ended, by how.", "# TYPE unmask_requests_total counter",
        f'unmask_requests_total{{status="finished"}} {m.finished}',
        f'unmask_requests_total{{status="aborted"}} {m.aborted}',
        "# HELP unmask_request_forwards_total Forwards summed over requests (NFE).",
        "# TYPE unmask_request_forwards_total counter", f"unmask_request_forwards_total {m.nfe}",
        "# HELP unmask_tokens_committed_total Tokens committed.", "# TYPE unmask_tokens_committed_total counter",
        f"unmask_tokens_committed_total {m.tokens}",
        "# HELP unmask_tokens_per_forward Tokens committed per request-forward.",
        "# TYPE unmask_tokens_per_forward gauge", f"unmask_tokens_per_forward {m.tokens / m.nfe if m.nfe else 0.0}",
    ]
    if m.drafts:  # speculative decoding (vLLM's spec_decode counters, by these names)
        lines += [
            "# HELP unmask_spec_decode_num_drafts_total Drafted blocks verified.",
            "# TYPE unmask_spec_decode_num_drafts_total counter", f"unmask_spec_decode_num_drafts_total {m.drafts}",
            "# HELP unmask_spec_decode_num_draft_tokens_total Draft tokens proposed.",
            "# TYPE unmask_spec_decode_num_draft_tokens_total counter",
            f"unmask_spec_decode_num_draft_tokens_total {m.draft_tokens}",
            "# HELP unmask_spec_decode_num_accepted_tokens_total Draft tokens accepted by the target.",
            "# TYPE unmask_spec_decode_num_accepted_tokens_total counter",
            f"unmask_spec_decode_num_accepted_tokens_total {m.accepted_tokens}",
            "# HELP unmask_spec_decode_mean_accepted_length Tokens per verify forward (accepted drafts + 1).",
            "# TYPE unmask_spec_decode_mean_accepted_length gauge",
            f"unmask_spec_decode_mean_accepted_length {1 + m.accepted_tokens / m.drafts}",
        ]
    pc = engine.prefix_cache
    if pc is not None:  # prompt K/V shared across requests (vLLM's prefix_cache_queries / _hits, in tokens)
        s = pc.stats
        lines += [
            "# HELP unmask_prefix_cache_queries_total Prompt tokens looked up in the prefix cache.",
            "# TYPE unmask_prefix_cache_queries_total counter", f"unmask_prefix_cache_queries_total {s.queries}",
            "# HELP unmask_prefix_cache_hits_total Prompt tokens whose K/V the prefix cache gave.",
            "# TYPE unmask_prefix_cache_hits_total counter", f"unmask_prefix_cache_hits_total {s.hits}",
            "# HELP unmask_prefix_cache_hit_rate Hits over queries, in tokens.",
            "# TYPE unmask_prefix_cache_hit_rate gauge",
            f"unmask_prefix_cache_hit_rate {s.hits / s.queries if s.queries else 0.0}",
            "# HELP unmask_prefix_cache_requests_total Requests looked up, by whether they reused a page.",
            "# TYPE unmask_prefix_cache_requests_total counter",
            f'unmask_prefix_cache_requests_total{{result="hit"}} {s.hit_requests}',
            f'unmask_prefix_cache_requests_total{{result="miss"}} {s.lookups - s.hit_requests}',
            "# HELP unmask_prefix_cache_evictions_total Pages dropped for room.",
            "# TYPE unmask_prefix_cache_evictions_total counter", f"unmask_prefix_cache_evictions_total {s.evicted}",
            "# HELP unmask_prefix_cache_pages Pages held.", "# TYPE unmask_prefix_cache_pages gauge",
            f"unmask_prefix_cache_pages {pc.pages}",
            "# HELP unmask_prefix_cache_bytes Bytes its pool holds.", "# TYPE unmask_prefix_cache_bytes gauge",
            f"unmask_prefix_cache_bytes {pc.bytes}",
            "# HELP unmask_prefix_cache_budget_bytes The most bytes its pool may hold.",
            "# TYPE unmask_prefix_cache_budget_bytes gauge", f"unmask_prefix_cache_budget_bytes {pc.budget}",
        ]
    lines += m.step_seconds.prometheus("unmask_step_seconds", "Engine step time.")
    lines += m.ttft.prometheus("unmask_time_to_first_token_seconds", "Arrival to the first committed token.")
    return "\n".join(lines) + "\n"
