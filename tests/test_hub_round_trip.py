"""The Hub round trip, for real and offline: models pushed through huggingface_hub's own client over HTTP to the
Hub API of ``tests/hub_server.py`` on 127.0.0.1 (git-LFS for the weights, as the Hub takes them with Xet off), then
loaded back by ``from_pretrained`` from that endpoint into a fresh cache, with ssmhub and, as remote code, without.

huggingface_hub reads ``HF_ENDPOINT`` when it is imported, so every push and load runs in a Python subprocess with
the environment of ``LocalHub.env`` (its own HF_HOME each time: nothing cached from a previous step). Each child
writes what it computed to a file under ``tmp_path``; the helpers here (``run_python``, ``push_tiny_model``,
``load_in_subprocess``) serve any command that pushes, e.g. a converter's ``--push_to_hub``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from comparisons import same_values
from hub_server import TOKEN, local_hub
from training.training_helpers import tiny_args, write_tiny_wikitext

IDS = [[3, 17, 9, 30, 1, 22, 5, 12, 8, 27, 14], [0, 4, 31, 7, 19, 2, 25, 11, 6, 29, 16]]  # < the tiny vocab of 32
TINY_DLR = {"vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2, "state_size": 4, "pad_token_id": 0}
NO_SSMHUB = 'import sys\nsys.modules["ssmhub"] = None  # from here on, any import of ssmhub raises ImportError\n'


@pytest.fixture(scope="module")
def hub():
    """A local Hub for this module's tests, stopped when they end, failed or not."""
    with local_hub() as running:
        yield running
        assert running.errors == [], running.errors  # no exception inside the Hub's own code


@pytest.fixture(scope="module")
def tiny(hub, tmp_path_factory) -> dict:
    """A tiny DLR causal LM pushed to ``user/tiny`` with its code (:func:`push_tiny_model`)."""
    return push_tiny_model(hub, tmp_path_factory.mktemp("tiny"), "user/tiny")


def run_python(hub, tmp_path: Path, script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``script`` (``-c``; empty: ``args``, e.g. ``-m`` and a module) in a fresh Python pointed at ``hub`` (its
    own HF_HOME, matplotlib's cache under ``tmp_path`` too); it must succeed. stdin is closed, so a prompt (e.g. for
    remote code) fails instead of waiting."""
    command = [sys.executable, "-c", script] if script else [sys.executable, *args]
    result = subprocess.run(
        command,
        env={**os.environ, **hub.env(tmp_path), "MPLCONFIGDIR": str(tmp_path / "matplotlib")},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{command[1:3]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


def push_tiny_model(hub, tmp_path: Path, repo_id: str | None, configs: list[dict] | None = None, name="tiny") -> dict:
    """Build a seeded tiny DLR causal LM and ``save_pretrained(tmp_path / name, push_to_hub=True, repo_id=repo_id,
    save_code=True)`` it in a subprocess (no ``repo_id``: the folder's name, as transformers), once per config of
    ``configs``, each into the same folder. Returns what the last model computed before its push: ``ids``,
    ``logits``, ``state_dict``, and the ``folder`` it was saved in."""
    folder, out = tmp_path / name, tmp_path / f"pushed-{name}.pt"
    hub_options = {"push_to_hub": True, "save_code": True, **({"repo_id": repo_id} if repo_id else {})}
    script = f"""
        import torch
        import ssmhub
        ids = torch.tensor({IDS!r})
        for config in {configs or [TINY_DLR]!r}:
            torch.manual_seed(0)
            model = ssmhub.DLRForCausalLM(ssmhub.DLRConfig(**config)).eval()
            model.save_pretrained({str(folder)!r}, **{hub_options!r})
        with torch.no_grad():
            torch.save({{"ids": ids, "logits": model(ids).logits, "state_dict": model.state_dict()}}, {str(out)!r})
    """
    run_python(hub, tmp_path, textwrap.dedent(script))
    return {**torch.load(out), "folder": folder}


def load_in_subprocess(hub, tmp_path: Path, repo_id: str, trust_remote_code: bool, ids, text: str = "") -> dict:
    """``AutoModelForCausalLM.from_pretrained(repo_id)`` from ``hub`` in a fresh process and cache: with
    ``trust_remote_code`` in a Python where ``import ssmhub`` fails (checked there), else after ``import ssmhub``.
    Returns the loaded model's ``logits`` on ``ids``, its ``state_dict``, the ``module`` of its class, the
    ``snapshots`` (commits) its files were cached from, and with ``text`` the ``token_ids`` the repo's tokenizer
    (``AutoTokenizer``) gives it."""
    out = tmp_path / f"loaded-{repo_id.replace('/', '--')}-{'remote' if trust_remote_code else 'ssmhub'}.pt"
    prelude = NO_SSMHUB if trust_remote_code else "import ssmhub\n"
    script = f"""
        import os
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained({repo_id!r}, trust_remote_code={trust_remote_code}).eval()
        try:
            import ssmhub
            importable = True
        except ImportError:
            importable = False
        assert importable is not {trust_remote_code}, "import ssmhub must fail exactly in the remote-code child"
        with torch.no_grad():
            logits = model(torch.tensor({ids.tolist()!r})).logits
        result = {{"logits": logits, "state_dict": model.state_dict(), "module": type(model).__module__}}
        if {text!r}:
            result["token_ids"] = AutoTokenizer.from_pretrained({repo_id!r})({text!r})["input_ids"]
        cached = os.path.join(os.environ["HF_HUB_CACHE"], "models--" + {repo_id!r}.replace("/", "--"), "snapshots")
        torch.save({{**result, "snapshots": sorted(os.listdir(cached))}}, {str(out)!r})
    """
    run_python(hub, tmp_path, prelude + textwrap.dedent(script))
    return torch.load(out)


def same_model(loaded: dict, pushed: dict, what: str) -> None:
    """The loaded weights are the pushed ones to the bit (a copy through safetensors and HTTP), in the same order;
    its logits are another process's forward of them, equal within float32 round-off (tests/comparisons.py)."""
    assert list(loaded["state_dict"]) == list(pushed["state_dict"]), what
    for name, tensor in pushed["state_dict"].items():
        assert torch.equal(loaded["state_dict"][name], tensor), f"{what}: {name} changed on the way"
    same_values(loaded["logits"], pushed["logits"], what=f"{what}: logits")


def lfs_puts(hub, repo_id: str, data: bytes) -> int:
    """How many times the LFS transfer uploaded ``data`` to ``repo_id`` (a PUT to the href of its sha256)."""
    return len(hub.served("PUT", f"^/lfs/{repo_id}/{hashlib.sha256(data).hexdigest()}$"))


def test_save_pretrained_pushes_weights_by_lfs_and_the_code_in_one_commit(hub, tiny):
    """``save_pretrained(push_to_hub=True, save_code=True)``: one commit after the Hub's own, holding the folder as
    written (weights, config with ``auto_map``, the flat code: the upload runs after the code is written), the
    safetensors uploaded once by the LFS transfer (its bytes PUT, then committed as a pointer), the rest inline."""
    files = hub.uploads("user/tiny")
    assert {"config.json", "model.safetensors", "modeling_dlr.py", "configuration_dlr.py"} <= set(files)
    assert {path: data for path, data in files.items() if path != ".gitattributes"} == {
        p.name: p.read_bytes() for p in tiny["folder"].iterdir()
    }
    assert hub.lfs_paths("user/tiny") == {"model.safetensors"}
    assert lfs_puts(hub, "user/tiny", files["model.safetensors"]) == 1
    assert "AutoModelForCausalLM" in json.loads(files["config.json"])["auto_map"]
    assert [c.message for c in hub.commits("user/tiny")][1:] == ["Upload folder using huggingface_hub"]


def test_from_pretrained_from_the_hub_gives_the_pushed_model(hub, tiny, tmp_path):
    """With ssmhub installed, ``from_pretrained("user/tiny")`` resolves main to its head commit (``model_info``),
    downloads the pushed files from it (HEAD, then GET of each /resolve) into a fresh cache, and builds ssmhub's
    class with the pushed weights."""
    loaded = load_in_subprocess(hub, tmp_path, "user/tiny", trust_remote_code=False, ids=tiny["ids"])
    assert loaded["module"].startswith("ssmhub.")
    head = hub.commits("user/tiny")[-1].oid
    assert loaded["snapshots"] == [head] and hub.served("GET", rf"^/user/tiny/resolve/{head}/model\.safetensors$")
    same_model(loaded, tiny, "loaded with ssmhub")


def test_remote_code_from_the_hub_loads_without_ssmhub(hub, tiny, tmp_path):
    """``trust_remote_code=True`` where ssmhub cannot be imported: transformers fetches the flat code files from the
    Hub (each relative import its own download) into its modules cache and builds the pushed model from them."""
    loaded = load_in_subprocess(hub, tmp_path, "user/tiny", trust_remote_code=True, ids=tiny["ids"])
    assert loaded["module"].startswith("transformers_modules.") and loaded["module"].endswith(".modeling_dlr")
    code = {path for path in hub.uploads("user/tiny") if path.endswith(".py")}
    fetched = {r[1].rpartition("/")[2] for r in hub.served("GET", r"^/user/tiny/resolve/[^/]+/[^/]+\.py$")}
    assert "modeling_dlr.py" in fetched and fetched <= code
    same_model(loaded, tiny, "loaded as remote code")


def test_a_second_push_of_the_same_model_commits_nothing_and_a_changed_one_uploads_again(hub, tmp_path):
    """Without ``repo_id`` ssmhub pushes to the folder's name in the token's namespace, and again into the repo that
    exists (``create_repo(exist_ok=True)`` gets the Hub's 409). The client asks the Hub which files it holds already
    (preupload oids, LFS batch): the same folder again adds no commit and uploads no bytes; other weights are a new
    LFS object in a new commit at the head."""
    changed = {**TINY_DLR, "state_size": 2}
    pushed = push_tiny_model(hub, tmp_path, None, configs=[TINY_DLR, TINY_DLR, changed], name="again")
    commits = hub.commits("user/again")
    assert [c.message for c in commits][1:] == ["Upload folder using huggingface_hub"] * 2
    assert hub.served("POST", "^/api/repos/create$").count(("POST", "/api/repos/create", 409)) >= 2
    first, last = (commit.files["model.safetensors"].data for commit in commits[1:])
    assert lfs_puts(hub, "user/again", first) == 1 and lfs_puts(hub, "user/again", last) == 1 and first != last
    assert hub.uploads("user/again")["model.safetensors"] == (pushed["folder"] / "model.safetensors").read_bytes()


def test_ssmhub_train_pushes_its_run_and_it_loads_back(hub, tmp_path):
    """``ssmhub-train --push_to_hub --hub_model_id user/trained`` (a run of two steps): the Hub gets the output
    folder (model, tokenizer, model card, loss plot) without its checkpoints, byte for byte, and the model and its
    tokenizer load back from it in a fresh process."""
    data = write_tiny_wikitext(tmp_path / "data")
    out = tmp_path / "run"
    options = {"max_steps": 2, "warmup_steps": 1, "eval_steps": 2, "save_steps": 1, "max_eval_windows": 4}
    flags = tiny_args(data, out, **options, push_to_hub=None, hub_model_id="user/trained")
    run_python(hub, tmp_path, "", "-m", "ssmhub.training.cli", *flags)
    files = hub.uploads("user/trained")
    assert (out / "checkpoints").is_dir() and not any(path.startswith("checkpoints") for path in files)
    local = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {path: data for path, data in files.items() if path != ".gitattributes"} == {
        path: data for path, data in local.items() if not path.startswith("checkpoints")
    }
    assert {"model.safetensors", "tokenizer.json", "README.md", "loss.png"} <= set(files)
    assert {"model.safetensors", "loss.png"} <= hub.lfs_paths("user/trained")  # the binary files, by LFS
    assert "user/trained" in files["README.md"].decode()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    text = " the history of the river"
    ids = AutoTokenizer.from_pretrained(out)(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        trained = {"logits": model(ids).logits, "state_dict": model.state_dict()}
    loaded = load_in_subprocess(hub, tmp_path, "user/trained", trust_remote_code=False, ids=ids, text=text)
    assert loaded["token_ids"] == ids[0].tolist()
    same_model(loaded, trained, "trained")


def raw_request(hub, method: str, path: str, body: bytes = b"", token: str = TOKEN) -> tuple[int, dict, dict]:
    """One request to ``hub`` by urllib, as no client would send it: (status, headers, JSON answer)."""
    request = urllib.request.Request(hub.endpoint + path, data=body or None, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def test_the_local_hub_refuses_what_the_hub_refuses_with_the_errors_the_client_names(hub):
    """huggingface_hub's client (in this process, its endpoint given) meets the Hub's refusals as named errors; a
    request outside the served API, or a commit naming an LFS object never uploaded, gets a status and a message
    that say what was wrong."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    with pytest.raises(HfHubHTTPError, match="Invalid user token"):
        HfApi(endpoint=hub.endpoint, token="hf_not_the_token").whoami()
    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    assert api.whoami()["name"] == "user"
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("user/no-such-repo")
    assert api.create_repo("errors").repo_id == "user/errors"  # the token's namespace
    with pytest.raises(RevisionNotFoundError):
        api.model_info("user/errors", revision="0" * 40)
    assert api.list_repo_files("user/errors") == [".gitattributes"]  # the Hub's first commit

    never_uploaded = {"key": "lfsFile", "value": {"path": "w.bin", "oid": "a" * 64}}
    lines = [{"key": "header", "value": {"summary": "x"}}, never_uploaded]
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    status, _, answer = raw_request(hub, "POST", "/api/models/user/errors/commit/main", body)
    assert status == 400 and "was not uploaded" in answer["error"]
    status, headers, answer = raw_request(hub, "POST", "/api/models/user/errors/commit/main", b"{not json")
    assert status == 400 and "not NDJSON" in answer["error"] and headers["X-Error-Message"] == answer["error"]
    status, _, answer = raw_request(hub, "GET", "/api/spaces/user/errors")
    assert status == 404 and "serves no GET /api/spaces/user/errors" in answer["error"]
    assert raw_request(hub, "POST", "/api/repos/create", b'{"name": "x"}', token="hf_wrong")[0] == 401


def test_ssmhub_convert_h3_pushes_the_converted_model_and_it_loads_back(hub, tmp_path):
    """``ssmhub-convert-h3 model.pt OUT --push_to_hub --hub_model_id user/h3-converted`` on the authors'-layout
    fixture (tests/models/data/h3_authors): the Hub gets the folder byte for byte and the model loads back from it in
    a fresh process with the converted weights."""
    checkpoint = Path(__file__).parent / "models" / "data" / "h3_authors" / "rotary.model.pt"
    out = tmp_path / "converted"
    flags = [str(checkpoint), str(out), "--no_tokenizer", "--num_attention_heads", "2"]
    run_python(
        hub, tmp_path, "", "-m", "ssmhub.models.h3.convert_h3", *flags, "--push_to_hub", "--hub_model_id", "user/h3"
    )
    files = hub.uploads("user/h3")
    local = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {path: data for path, data in files.items() if path != ".gitattributes"} == local
    assert "model.safetensors" in hub.lfs_paths("user/h3")

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[1, 5, 9, 33, 60, 2]])
    with torch.no_grad():
        converted = {"logits": model(ids).logits, "state_dict": model.state_dict()}
    same_model(load_in_subprocess(hub, tmp_path, "user/h3", trust_remote_code=False, ids=ids), converted, "converted")
