"""A Mooncake-format trace shaped like the real FAST'25 conversation trace (held out).

Usage: python3 conversation_like_trace.py [SEED] [CONVERSATIONS] > conv-like.jsonl

Built from what is published about that trace (ANCHORS.md; the importer's
derivation of it in BENCHMARKS.md): ~12k requests, ~8k conversations of which
~75 % are one request (they never return), continuations that keep all of the
predecessor's 512-token blocks but the last (re-hashed: the partial last block is
rewritten next turn), ~3 % regenerations, 8 common system-prompt heads (deepest 145
blocks), mean input ~13k tokens. Assumptions, not facts of the real trace: head
popularity, the log-normal sizes and gaps below, no cross-conversation resends.
"""
import json, random, sys, math
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
n_conv = int(sys.argv[2]) if len(sys.argv) > 2 else 8044
rng = random.Random(seed)
B = 512
next_id = [0]
def new_ids(k):
    out = list(range(next_id[0], next_id[0] + k)); next_id[0] += k; return out
head_blocks = [3, 6, 10, 16, 24, 40, 80, 145]
head_w = [30, 22, 16, 12, 8, 6, 4, 2]
heads = [new_ids(h) for h in head_blocks]
span = 3540_000
reqs = []
def lognorm(med, sigma):
    return med * math.exp(rng.gauss(0, sigma))
for c in range(n_conv):
    h = rng.choices(range(len(heads)), head_w)[0]
    head = heads[h]
    # first prompt: head + user part
    user = int(lognorm(2300, 1.0)) + 50
    length = len(head) * B + user
    ids = head + new_ids(math.ceil(length / B) - len(head))
    # turns: 75 % single
    if rng.random() < 0.747:
        turns = 1
    else:
        turns = 2
        while turns < 43 and rng.random() < 0.50:
            turns += 1
    t = rng.uniform(0, span)
    for k in range(turns):
        out = max(1, int(lognorm(250, 0.8)))
        reqs.append((int(t), length, out, list(ids)))
        if k + 1 == turns:
            break
        # next: regeneration (2 %) or continuation
        if rng.random() < 0.03:
            t += rng.uniform(2_000, 60_000)
            continue
        gap = rng.uniform(3_000, 30_000) if rng.random() < 0.4 else lognorm(60_000, 0.9)
        t += gap
        add = out + int(lognorm(600, 1.2)) + 10
        keep = ids[:-1]  # the partial last block is re-hashed
        length = length + add
        ids = keep + new_ids(math.ceil(length / B) - len(keep))
reqs.sort(key=lambda r: r[0])
for ts, il, ol, ids in reqs:
    print(json.dumps({"timestamp": ts, "input_length": il, "output_length": ol, "hash_ids": ids}))
