"""64 concurrent `openai` clients against one `kvtier serve` (16 sequences, the rest queued; loopback):
every request completes (0 failures; streamed and plain mixed), greedy answers equal those of the same
prompt alone, and afterwards the server is idle again: no active or queued request, and its resident
memory back at the idle figure measured after a warm-up round (within 5%: nothing grows per request)."""
import concurrent.futures
import time

import openai

from serverlib import Server, model

N_CLIENTS = 64


def ask(c, model_id, i, stream):
    prompt = f"Item {i % 8}: a short note about the number {i % 8} is"
    if stream:
        parts = [ch.choices[0].text for ch in c.completions.create(
            model=model_id, prompt=prompt, max_tokens=8, temperature=0, stream=True)]
        return prompt, "".join(parts)
    r = c.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=0)
    assert r.usage.completion_tokens == 8
    return prompt, r.choices[0].text


def round_of(s, c):
    with concurrent.futures.ThreadPoolExecutor(N_CLIENTS) as ex:
        futs = [ex.submit(ask, c, s.model_id, i, i % 2 == 0) for i in range(N_CLIENTS)]
        return [f.result(timeout=600) for f in futs]  # any exception fails the test


def wait_idle(s):
    deadline = time.time() + 30
    while time.time() < deadline:
        m = s.metrics()
        if m["kvtier_active_sequences"] == 0 and m["kvtier_queue_length"] == 0:
            return m
        time.sleep(0.2)
    raise AssertionError(f"the server did not become idle: {m}")


def test_64_concurrent_clients():
    with Server(model("smollm2"), "--max-seqs", 16, "--max-queue", 64, "--ctx", 256) as s:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=600)
        # Reference: each distinct prompt alone, one at a time.
        ref = {}
        for i in range(8):
            p, t = ask(c, s.model_id, i, False)
            ref[p] = t
        warm = round_of(s, c)
        wait_idle(s)
        idle_rss = s.rss_kib()
        results = round_of(s, c)
        m = wait_idle(s)
        rss = s.rss_kib()
        assert len(results) == N_CLIENTS
        for p, t in warm + results:
            assert t == ref[p], p  # batched with others, the same greedy text as alone
        assert m['kvtier_requests_total{outcome="done"}'] == 8 + 2 * N_CLIENTS
        assert m['kvtier_requests_total{outcome="failed"}'] == 0
        assert m['kvtier_requests_total{outcome="cancelled"}'] == 0
        assert m['kvtier_http_responses_total{code="200"}'] >= 8 + 2 * N_CLIENTS
        assert not any(k.startswith('kvtier_http_responses_total{code="4') or
                       k.startswith('kvtier_http_responses_total{code="5') for k in m)
        assert m["kvtier_steps_total"] < 2 * N_CLIENTS * 9  # requests really shared passes
        assert rss <= idle_rss * 1.05, (idle_rss, rss)
