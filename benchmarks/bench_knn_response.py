"""The kNN request of a warm question, replayed in variants: what each part of its response costs.

Each backend's ``Searcher`` answers the questions once (the bodies its kNN searches sent are kept), then
each body is sent again in every variant, the variants in turn question by question, ``--rounds``
rounds: the client's time (body to parsed dict), the engine's ``took`` and the response's bytes.
Variants (``variants``): as sent (doc values, no stored field); the hits' fields from ``_source`` as before;
without the stored keys; a ``filter_path`` to what is parsed.
The indexes ``bench_engines.py --work`` keeps.

    python benchmarks/bench_knn_response.py --work /work/data/w20 --prefix bench \\
        --opensearch-url http://127.0.0.1:9200 --elasticsearch-url http://127.0.0.1:9201
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import urllib.request
from typing import Any

import numpy as np
from bench_engines import kept_index_options, make_questions, model_for
from bench_lazy import FRAGMENT, wikipedia_shaped
from common import environment, load_average, write_results

from bertknn_search.backends.engines.bodies import CONTEXT_FIELDS
from bertknn_search.config import Config
from bertknn_search.query.search import Searcher

FILTER = "_shards.failed,hits.hits._score,hits.hits._source,hits.hits.fields,hits.hits.sort,aggregations"


def variants(body: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each variant's body and request parameters: as sent (doc values, no stored field), the hits'
    fields from ``_source`` as before (each hit's stored-field block read), without the keys, and with a
    ``filter_path`` to what is parsed."""
    keys = "key" in body.get("docvalue_fields", ())
    source = {k: v for k, v in body.items() if k not in ("stored_fields", "docvalue_fields")}
    source |= {"_source": CONTEXT_FIELDS} | ({"docvalue_fields": ["key"]} if keys else {})
    no_keys = {**body, "docvalue_fields": [f for f in body.get("docvalue_fields", ()) if f != "key"]}
    return {
        "as sent": (body, {}),
        "_source": (source, {}),
        "no keys": (no_keys, {}),
        "filter_path": (body, {"filter_path": FILTER}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    args = kept_index_options(parser, "opensearch,elasticsearch")
    model, layer = model_for(args.model)
    questions = make_questions(
        wikipedia_shaped(FRAGMENT, args.articles, args.seed), args.questions, args.seed
    )
    base = Config(model=str(model), layer=layer, device="cpu", contexts="eager")
    load0 = load_average()
    out: dict[str, Any] = {"benchmark": "knn_response", "env": environment("cpu"), "backends": {}}
    for name in args.backends.split(","):
        url = {f"{name}_url": getattr(args, f"{name}_url")}
        searcher = Searcher.open(base.replace(backend=name, opensearch_prefix=args.prefix, **url))
        backend = searcher.backend
        sent: list[dict[str, Any]] = []
        original = backend._search_contexts

        def keep(body: dict[str, Any], original: Any = original, sent: list[dict[str, Any]] = sent) -> Any:
            sent.append(body)
            return original(body)

        backend._search_contexts = keep
        for q in questions:
            searcher.answer(q)
        client, index = backend.client, backend.names["contexts"]
        rows: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for body in sent:
                for variant, (b, params) in variants(body).items():
                    started = time.perf_counter()
                    response = client.search(index=index, body=b, **params)
                    seconds = time.perf_counter() - started
                    raw = getattr(response, "body", response)
                    row = rows.setdefault(variant, {"ms": [], "took": [], "hits": []})
                    row["ms"].append(seconds * 1e3)
                    row["took"].append(float(raw.get("took", 0)))
                    row["hits"].append(len(raw["hits"]["hits"]))
        # Bytes, once per variant: the raw response to the first body.
        for variant, (b, params) in variants(sent[0]).items():
            query = urllib.parse.urlencode(params)
            request = urllib.request.Request(
                f"{url[f'{name}_url']}/{index}/_search?{query}",
                data=json.dumps(b).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request) as answer:
                rows[variant]["bytes"] = [float(len(answer.read()))]
        searcher.close()
        out["backends"][name] = {v: {k: float(np.median(x)) for k, x in r.items()} for v, r in rows.items()}
    out["load_before"], out["load_after"] = load0, load_average()
    print(f"load {load0} -> {out['load_after']}; {out['env']['cpu']}")
    for name, found in out["backends"].items():
        print(f"\n{name}: variant | client ms p50 | took ms p50 | hits | response bytes")
        for v, r in found.items():
            print(f"  {v:<26} {r['ms']:7.2f} {r['took']:6.1f} {r['hits']:5.0f} {r['bytes'] / 1e3:8.1f} KB")
    if args.out:
        write_results(args.out, out)


if __name__ == "__main__":
    main()
