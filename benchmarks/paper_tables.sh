#!/usr/bin/env bash
# The paper's Tables 2 and 3 with the real BERT-base (docs/evaluation.md, "The paper's model"), in order.
# Each step resumes when run again (eval run continues from its facts.jsonl). Usage:
#   UNCASED=~/.cache/bertknn-search/models/bert-base-uncased CASED=~/.cache/bertknn-search/models/bert-base-cased \
#   W=/work/data/h48b N=4 E=2 bash benchmarks/paper_tables.sh [step...]
# Steps: sample datastore bert warm paper grid noir layers tables (default: all, in this order).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-.venv/bin/bertknn-search}
PY=${PY:-.venv/bin/python}
LAMA=${LAMA:-../shared/data/lama}
UHN=${UHN:-../shared/data/lama-uhn}
WIKI=${WIKI:-../shared/data/wiki-sample/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2}
UNCASED=${UNCASED:-$HOME/.cache/bertknn-search/models/bert-base-uncased}
CASED=${CASED:-$HOME/.cache/bertknn-search/models/bert-base-cased}
W=${W:-/tmp/paper-tables}       # work folder: sample, corpora, indexes, runs
N=${N:-4}                       # T-REx facts per relation for the datastore columns (the first N)
E=${E:-2}                       # evidence sentences kept per fact
BERT_N=${BERT_N:-100}           # facts per relation for the BERT-alone columns (no datastore needed)
LAYER_RELS=${LAYER_RELS:-P19,P103,P106,P176,P364,P413,P1412,P20,P39,P127,P140,P264,P463,P740}  # the layers subset
S=$W/sample$N
R=$W/runs
mkdir -p "$W" "$R"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(sample datastore bert warm paper grid noir layers tables)

tiny_index() {  # a one-sentence eager index: BERT alone needs no datastore, eval run needs an index
  [ -d "$W/idx-tiny-$2" ] && return
  echo '{"id": "tiny", "title": "Tiny", "text": "Paris is a city."}' > "$W/tiny.jsonl"
  $B ingest wiki "$W/tiny.jsonl" --model "$1" --layer 11 --contexts eager --index "$W/idx-tiny-$2" --no-progress
}

for step in "${steps[@]}"; do
  case $step in
  sample)  # the same facts for every column; UHN = the sampled T-REx facts that LAMA-UHN keeps
    $PY benchmarks/paper_tables.py sample --lama "$LAMA" --lama-uhn "$UHN" --per-relation "$N" --evidences "$E" --out "$S"
    $PY benchmarks/paper_tables.py distractors --wiki "$WIKI" --max-chars 3000 --limit 40 --out "$W/distractors.jsonl"
    $B eval corpus --lama "$S/lama" --lama-uhn "$S/lama-uhn" --out "$W/corpus$N.jsonl"
    cat "$W/corpus$N.jsonl" "$W/distractors.jsonl" > "$W/datastore$N.jsonl" ;;
  datastore)  # lazy: text and IR now, contexts on first use (or by warm)
    $B ingest wiki "$W/datastore$N.jsonl" --model "$UNCASED" --layer 11 --index "$W/idx-l11" --no-progress ;;
  bert)  # BERT alone: more facts (no datastore); cased + LAMA's common vocabulary is Petroni et al.'s protocol
    tiny_index "$UNCASED" uncased; tiny_index "$CASED" cased
    CV=(--common-vocab "$LAMA/common_vocab_cased.txt")
    $B eval run --lama "$LAMA" --corpora SQuAD --index "$W/idx-tiny-uncased" --out "$R/bert-uncased-squad" --no-progress
    $B eval run --lama "$LAMA" --corpora SQuAD --index "$W/idx-tiny-cased" "${CV[@]}" --out "$R/bert-cased-cv-squad" --no-progress
    $B eval run --lama "$LAMA" --corpora T-REx --lama-uhn "$UHN" --per-relation "$BERT_N" --index "$W/idx-tiny-cased" \
      "${CV[@]}" --out "$R/bert-cased-cv-$BERT_N" --no-progress
    $B eval run --lama "$LAMA" --corpora T-REx --lama-uhn "$UHN" --per-relation "$BERT_N" --index "$W/idx-tiny-uncased" \
      --out "$R/bert-uncased-$BERT_N" --no-progress ;;
  warm)  # encode every article the sample's questions search (N=3; the grid's N 4-5 encode the rest on use)
    $B eval warm --lama "$S/lama" --corpora T-REx,SQuAD --lama-uhn "$S/lama-uhn" --index "$W/idx-l11" ;;
  paper)  # Table 2: the paper's settings (N=3, k=128, l=6, λ=0.3, layer 11), exact answers
    $B eval run --lama "$S/lama" --corpora T-REx,SQuAD --lama-uhn "$S/lama-uhn" --index "$W/idx-l11" --exact \
      --out "$R/l11-paper" --no-progress ;;
  grid)  # λ, k, l, N from one pass each; choose on one half of the relations, score on the other
    for half in a b; do
      rels=$($PY -c "import json,sys; r=sorted(json.load(open('$S/sample.json'))['trex']); print(','.join(r[0::2] if '$half'=='a' else r[1::2]))")
      $B eval grid --lama "$S/lama" --corpora T-REx --relations "$rels" --index "$W/idx-l11" \
        --grid-temperature 5,6,7,8,9,10,11,12 --out "$R/grid-$half.settings.json" --json --no-progress > "$R/grid-$half.json"
    done ;;
  noir)  # kNN over every context of the datastore: every article encoded first (by title; warm did most)
    $PY -c "import json,sys; [print(json.loads(l)['title']) for l in open(sys.argv[1])]" "$W/datastore$N.jsonl" > "$W/titles.txt"
    $B warm --titles "$W/titles.txt" --index "$W/idx-l11"
    $B eval run --lama "$S/lama" --corpora T-REx,SQuAD --lama-uhn "$S/lama-uhn" --index "$W/idx-l11" --no-ir \
      --out "$R/l11-noir" --no-progress ;;
  layers)  # another index per layer on a subset of relations (each a full re-encode), N=1; layer 11 beside it
    $PY benchmarks/paper_tables.py sample --lama "$LAMA" --lama-uhn "$UHN" --per-relation "$N" --evidences "$E" \
      --relations "$LAYER_RELS" --out "$W/sample-layers"
    $B eval corpus --lama "$W/sample-layers/lama" --out "$W/corpus-layers.jsonl"
    cat "$W/corpus-layers.jsonl" "$W/distractors.jsonl" > "$W/datastore-layers.jsonl"
    for L in 10 12; do
      $B ingest wiki "$W/datastore-layers.jsonl" --model "$UNCASED" --layer "$L" --index "$W/idx-l$L" --no-progress
      $B eval run --lama "$W/sample-layers/lama" --corpora T-REx --index "$W/idx-l$L" --n-articles 1 --exact \
        --out "$R/l$L-n1" --no-progress
    done
    $B eval run --lama "$W/sample-layers/lama" --corpora T-REx --index "$W/idx-l11" --n-articles 1 --exact \
      --out "$R/l11-n1" --no-progress ;;
  tables)
    $PY benchmarks/paper_tables.py tables "bert-uncased-$BERT_N=$R/bert-uncased-$BERT_N" "bert-uncased-squad=$R/bert-uncased-squad" \
      "bert-cased-cv-$BERT_N=$R/bert-cased-cv-$BERT_N" "bert-cased-cv-squad=$R/bert-cased-cv-squad" \
      "l11=$R/l11-paper" "l11-noir=$R/l11-noir" "l10-n1=$R/l10-n1" "l11-n1=$R/l11-n1" "l12-n1=$R/l12-n1" \
      --out "$W/tables.json" --per-relation T-REx
    $PY benchmarks/paper_tables.py ablation "$R/grid-a.json" "$R/grid-b.json" --out "$W/ablation.json" ;;
  *) echo "unknown step: $step" >&2; exit 2 ;;
  esac
done
