"""`kvtier serve` through the official `openai` Python client, on loopback: completions, chat, streaming,
stop strings, max tokens, seeds, errors (400, 404, 401, 429), a client that disconnects (its sequence is
freed), prefix reuse (resident and an offloaded placement with a disk home), /v1/models and /metrics.
Greedy answers are checked against `kvtier run` on the same prompt (the same tokens)."""
import json
import threading
import time

import http.client
import urllib.error
import urllib.request
import openai
import pytest

from serverlib import Server, model
from kvtier_testlib import run

PROMPT = "The history of the printing press begins"


def client(srv, **kw):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=srv.api_key or "none", max_retries=0, timeout=120, **kw)


def run_text(prompt, n, *extra):
    p = run("run", "-m", model("smollm2"), "-p", prompt, "-n", n, "-t", 2, "--json", *extra)
    return json.loads(p.stdout)["text"]


@pytest.fixture(scope="module")
def srv():
    with Server(model("smollm2"), "--max-seqs", 4, "--ctx", 2048) as s:
        yield s


def test_models_and_health(srv):
    c = client(srv)
    ids = [m.id for m in c.models.list()]
    assert ids == [srv.model_id]
    assert json.loads(srv.get("/health")) == {"status": "ok"}


def test_completion_greedy_matches_kvtier_run(srv):
    c = client(srv)
    r = c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=20, temperature=0)
    assert r.choices[0].text == run_text(PROMPT, 20)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 20 and r.usage.prompt_tokens > 3


def test_max_tokens(srv):
    c = client(srv)
    for n in (1, 3, 7):
        r = c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=n, temperature=0)
        assert r.usage.completion_tokens == n and r.choices[0].finish_reason == "length"


def test_stop_string(srv):
    c = client(srv)
    full = c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=20, temperature=0).choices[0].text
    words = full.split()
    stop = words[3]
    r = c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop, "@@@"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(stop)]
    assert stop not in r.choices[0].text


def test_streaming_equals_plain(srv):
    c = client(srv)
    plain = c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=16, temperature=0)
    pieces, finish = [], None
    for ch in c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=16, temperature=0, stream=True):
        pieces.append(ch.choices[0].text)
        finish = ch.choices[0].finish_reason or finish
    assert len([p for p in pieces if p]) > 3  # really streamed, piece by piece
    assert "".join(pieces) == plain.choices[0].text and finish == "length"


def test_chat_plain_and_streamed(srv):
    c = client(srv)
    msgs = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name a colour."}]
    r = c.chat.completions.create(model=srv.model_id, messages=msgs, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and text
    assert r.choices[0].finish_reason in ("stop", "length")
    # The same conversation through `kvtier run --chat`: the same greedy reply.
    assert text == run_text("Name a colour.", 12, "--chat", "--system", "You answer briefly.")
    deltas, usage = [], None
    for ch in c.chat.completions.create(model=srv.model_id, messages=msgs, max_tokens=12, temperature=0,
                                        stream=True, stream_options={"include_usage": True}):
        if ch.choices:
            deltas.append(ch.choices[0].delta.content or "")
        if ch.usage:
            usage = ch.usage
    assert "".join(deltas) == text
    assert usage.completion_tokens == r.usage.completion_tokens


def test_seed_reproducible_sampling(srv):
    c = client(srv)
    a = [c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=24, temperature=1.0, seed=s).choices[0].text
         for s in (11, 11, 12)]
    assert a[0] == a[1]
    assert a[0] != a[2]


def test_errors(srv):
    c = client(srv)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=srv.model_id, prompt=PROMPT, max_tokens=4, temperature=7)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=srv.model_id, prompt="word " * 3000, max_tokens=4)
    assert "context" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=srv.model_id, messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=srv.model_id, prompt=PROMPT, extra_body={"bogus": 1})


def test_api_key():
    with Server(model("smollm2"), "--max-seqs", 1, "--ctx", 512, api_key="sekrit") as s:
        ok = openai.OpenAI(base_url=s.base + "/v1", api_key="sekrit", max_retries=0)
        assert ok.completions.create(model=s.model_id, prompt="Hi", max_tokens=2, temperature=0).usage
        bad = openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=s.model_id, prompt="Hi", max_tokens=2)
        for path in ("/health", "/metrics", "/v1/models"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(s.base + path, timeout=30)
            assert e.value.code == 401 and "error" in json.loads(e.value.read())
        assert json.loads(s.get("/health")) == {"status": "ok"}  # with the key


def test_queue_bound_gives_429():
    # Deterministic order (no race with the scheduler): A is running (its first streamed token has
    # arrived), B waits in the queue (the gauge says so), then C, D, E find the queue full.
    with Server(model("smollm2"), "--max-seqs", 1, "--max-queue", 1, "--ctx", 1024) as s:
        c = client(s)
        results = {}

        def one(name, **kw):
            try:
                c.completions.create(model=s.model_id, prompt=PROMPT, temperature=0, **kw)
                results[name] = "ok"
            except openai.RateLimitError as e:
                assert "retry" in str(e)
                results[name] = 429

        stream = c.completions.create(model=s.model_id, prompt=PROMPT, max_tokens=600, temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks)  # A holds the only sequence
        b = threading.Thread(target=one, args=("B",), kwargs={"max_tokens": 5})
        b.start()
        deadline = time.time() + 60
        while s.metrics().get("kvtier_queue_length") != 1:
            assert time.time() < deadline, "B never reached the queue"
            time.sleep(0.05)
        for name in ("C", "D", "E"):
            one(name, max_tokens=5)
        assert [results[n] for n in ("C", "D", "E")] == [429, 429, 429], results
        for _ in chunks:  # A finishes; B then runs
            pass
        b.join(timeout=300)
        assert results["B"] == "ok", results
        m = s.metrics()
        assert m['kvtier_http_responses_total{code="429"}'] == 3


def test_disconnect_frees_the_sequence(srv):
    before = srv.metrics()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({"model": srv.model_id, "prompt": PROMPT, "max_tokens": 2000, "temperature": 0,
                                  "stream": True}))
    r = conn.getresponse()
    assert r.status == 200
    n = 0
    while n < 3:
        n += r.fp.readline().startswith(b"data: ")
    conn.sock.shutdown(2)
    conn.close()
    # Closed after 3 pieces: the request is cancelled and its sequence freed within a few steps.
    deadline = time.time() + 30
    while time.time() < deadline:
        m = srv.metrics()
        if (m['kvtier_requests_total{outcome="cancelled"}'] > before['kvtier_requests_total{outcome="cancelled"}']
                and m["kvtier_active_sequences"] == 0):
            break
        time.sleep(0.2)
    assert m['kvtier_requests_total{outcome="cancelled"}'] == before['kvtier_requests_total{outcome="cancelled"}'] + 1
    assert m["kvtier_active_sequences"] == 0
    assert m["kvtier_generated_tokens_total"] - before["kvtier_generated_tokens_total"] < 200


def test_disconnect_of_a_plain_request_frees_the_sequence(srv):
    """Not streamed: after 1 s the server answers chunked and writes a space now and then (JSON allows
    leading whitespace), so a client that left is noticed there."""
    before = srv.metrics()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({"model": srv.model_id, "prompt": PROMPT, "max_tokens": 3000, "temperature": 0}))
    time.sleep(2.5)
    conn.sock.shutdown(2)
    conn.close()
    key = 'kvtier_requests_total{outcome="cancelled"}'
    deadline = time.time() + 30
    while time.time() < deadline:
        m = srv.metrics()
        if m[key] > before[key] and m["kvtier_active_sequences"] == 0:
            break
        time.sleep(0.2)
    assert m[key] == before[key] + 1 and m["kvtier_active_sequences"] == 0
    assert m["kvtier_generated_tokens_total"] - before["kvtier_generated_tokens_total"] < 2500


def test_metrics(srv):
    m = srv.metrics()
    for k in ("kvtier_queue_length", "kvtier_active_sequences", 'kvtier_kv_bytes{tier="device"}',
              'kvtier_kv_moved_bytes_total{direction="load"}', "kvtier_kv_stall_seconds_total",
              "kvtier_generated_tokens_total", "kvtier_prompt_tokens_total", "kvtier_steps_total"):
        assert k in m, k
    assert m['kvtier_kv_bytes{tier="device"}'] > 0 and m["kvtier_generated_tokens_total"] > 0


@pytest.mark.parametrize("policy", [["--kv-policy", "resident"], ["--kv-policy", "layer", "--kv-disk", "{tmp}"],
                                    ["--kv-policy", "headinfer", "--group", "1"]])
def test_prefix_reuse(tmp_path, policy):
    """A second prompt that extends the first reuses its KV (cached_tokens) and still gives the tokens of
    a full prefill (the text of `kvtier run` on the whole prompt)."""
    policy = [a.replace("{tmp}", str(tmp_path)) for a in policy]
    doc = "Chapter one. The river bends twice before the old mill, and the miller counts the sacks. " * 6
    with Server(model("smollm2"), "--max-seqs", 2, "--ctx", 1024, *policy) as s:
        c = client(s)
        first = c.completions.create(model=s.model_id, prompt=doc + "Question: who counts?", max_tokens=4,
                                     temperature=0)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        second = c.completions.create(model=s.model_id, prompt=doc + "Question: what bends?", max_tokens=8,
                                      temperature=0)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached > 0.8 * first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)
        assert second.choices[0].text == run_text(doc + "Question: what bends?", 8)
        assert s.metrics()["kvtier_prompt_tokens_reused_total"] == cached


@pytest.mark.parametrize("policy", [["--kv-policy", "resident+h2o", "--kv-budget", "48"],
                                    ["--kv-policy", "layer+locret", "--kv-budget", "48", "--local-tail", "16",
                                     "--locret-heads", "{heads}"]])
def test_approximate_policies_answer_alike_alone_and_among_other_requests(tmp_path, policy):
    """h2o evicts at the end of each pass and locret after each pass of its prefill plan, so a prompt's
    result depends on where its passes end. serve feeds a prompt in the pieces planned at admission
    (passes of chunk - (max sequences - 1) tokens, so a piece fits beside every other sequence's decode
    token): the completion is the same alone and while two other requests generate, and it is `kvtier
    run --chunk 62`'s (chunk 64, 3 sequences)."""
    heads = tmp_path / "smollm2.locret.gguf"
    run("train-locret", "-m", model("smollm2"), "-o", heads, "--steps", 0, "--d-m", 16)
    policy = [a.replace("{heads}", str(heads)) for a in policy]
    doc = "Chapter one. The river bends twice before the old mill, and the miller counts the sacks. " * 8
    prompt = doc + "Question: what does the miller count?"
    with Server(model("smollm2"), "--max-seqs", 3, "--ctx", 1024, "--chunk", 64, *policy) as s:
        c = client(s)
        alone = c.completions.create(model=s.model_id, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
        others = []

        def other(i):
            r = c.completions.create(model=s.model_id, prompt=f"Story {i}: once upon a time " * (3 + 5 * i),
                                     max_tokens=40, temperature=0)
            others.append(r.usage.completion_tokens)

        threads = [threading.Thread(target=other, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # they are decoding (or still prefilling) when the prompt arrives
        among = c.completions.create(model=s.model_id, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
        for t in threads:
            t.join()
        assert others == [40, 40]
    assert among == alone
    assert alone == run_text(prompt, 12, "--ctx", 1024, "--chunk", 62, *policy)
