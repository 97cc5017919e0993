"""`hf-pretrain space`: write a Hugging Face Space that serves the demo for Hub models, and push it.

    hf-pretrain space --model me/llama-1b-step10k --model me/llama-1b --out space/
    hf-pretrain space --model me/llama-1b --out space/ --push me/llama-1b-demo

The Space holds app.py (hf_pretrain/publish/space_template/app.py as is: it needs neither hf-pretrain nor
this repository), demo.json (the models and example prompts it reads), requirements.txt and a
README.md whose front matter the Hub reads (sdk, sdk_version, app_file, title, models).
"""

from __future__ import annotations

import importlib.resources
import json
import sys
from pathlib import Path

from huggingface_hub import SpaceCard, SpaceCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id

from hf_pretrain.config import DEFAULT_PROMPTS, CommandParser
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_FAILED
from hf_pretrain.extras import install_line
from hf_pretrain.publish.hub import push_or_explain
from hf_pretrain.publish.targets import WRITTEN_RECORD, not_ours, record_written, unwritable_reason
from hf_pretrain.versions import installed_version

TEMPLATE_PACKAGE = "hf_pretrain.publish.space_template"
DEFAULT_TITLE = "Compare checkpoints"
# What app.py imports beyond gradio (the Space installs gradio itself, at sdk_version, with
# huggingface_hub). Pinned to the versions installed here, the ones the app was tested with.
RUNTIME_PACKAGES = ("torch", "transformers")
SPACE_FILES = ("app.py", "demo.json", "requirements.txt", "README.md")  # what `write_space` writes
COMMAND = "hf-pretrain space"


def pinned_version(package: str) -> str:
    """The installed version without its local tag (2.13.0+cpu -> 2.13.0: PyPI has no local tags)."""
    version = installed_version(package)
    if version is None:
        raise RuntimeError(
            f"{package} is not installed, so the Space cannot pin the version tested here: {install_line('demo')}"
        )
    return version.public


def requirements_txt() -> str:
    return "".join(f"{package}=={pinned_version(package)}\n" for package in RUNTIME_PACKAGES)


def readme(models: list[str], title: str) -> str:
    data = SpaceCardData(
        title=title,
        sdk="gradio",
        sdk_version=pinned_version("gradio"),
        app_file="app.py",
        models=models,
        short_description="Compare checkpoints of a pretraining run",
    )
    body = (
        f"# {title}\n\nThe same prompt through each model, side by side, streamed token by token:\n\n"
        + "".join(f"- [{m}](https://huggingface.co/{m})\n" for m in models)
        + "\nMade with `hf-pretrain space`; `python app.py` runs it locally (`DEMO_MODELS=a,b` to change "
        "the models).\n"
    )
    return str(SpaceCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))


class SpaceRefused(RuntimeError):
    """--out holds files this command did not write (or that changed since): nothing was written."""


def write_space(
    models: list[str],
    out: Path,
    title: str = DEFAULT_TITLE,
    prompts: list[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """The Space's files in `out`: an empty or new folder, or one this command wrote (its record there,
    the files unchanged since). Anything else raises `SpaceRefused` naming the files, unless
    `overwrite`: then the Space's own four files are replaced and the folder's other files kept."""
    clashes = not_ours(out, SPACE_FILES, COMMAND)
    if clashes and not overwrite:
        listed = ", ".join(clashes[:8]) + (f" and {len(clashes) - 8} more" if len(clashes) > 8 else "")
        raise SpaceRefused(
            f"{out} is not empty and holds files {COMMAND} did not write or that changed since: {listed}; it "
            f"writes only into an empty folder or one it wrote itself. Choose another --out, or pass --overwrite "
            f"to replace {', '.join(SPACE_FILES)} there (the folder's other files are kept)"
        )
    out.mkdir(parents=True, exist_ok=True)
    app = importlib.resources.files(TEMPLATE_PACKAGE).joinpath("app.py").read_text()
    (out / "app.py").write_text(app)
    demo_config = {"title": title, "models": models, "prompts": list(DEFAULT_PROMPTS if prompts is None else prompts)}
    (out / "demo.json").write_text(json.dumps(demo_config, indent=1) + "\n")
    (out / "requirements.txt").write_text(requirements_txt())
    (out / "README.md").write_text(readme(models, title))
    record_written(out, SPACE_FILES, COMMAND)
    return out


def push_space(folder: Path, space_id: str, private: bool | None = None) -> str | None:
    """Create the Space repo if needed (private=None: the account's default visibility) and upload
    `folder` as one commit, through the one upload path (offline check, token scrubbing); returns the
    commit's URL, or None after saying why not and how to push later."""
    return push_or_explain(
        folder,
        space_id,
        prog="hf-pretrain space",
        what="Space",
        private=private,
        repo_type="space",
        space_sdk="gradio",
        ignore=[WRITTEN_RECORD],  # this machine's record of what it wrote, not part of the Space
        commit_message="Update the checkpoint demo (hf-pretrain space)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="hf-pretrain space", description=__doc__)
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="REPO_ID",
        help="a model repo on the Hub (export a checkpoint first); repeat to compare several",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write the Space into")
    parser.add_argument("--push", metavar="SPACE_ID", help="also upload the folder to this Space (created if needed)")
    parser.add_argument("--private", action="store_true", help="create the Space private")
    parser.add_argument("--title", default=DEFAULT_TITLE, help="the page's title")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace {', '.join(SPACE_FILES)} in an --out that holds other files (those are kept); "
        f"without it, --out must be empty or a Space this command wrote",
    )
    args = parser.parse_args(argv)
    for repo_id in args.model + ([args.push] if args.push else []):
        if repo_id in args.model and Path(repo_id).exists():  # a Space runs on the Hub: it reads no local folder
            print(
                f"hf-pretrain space: --model {repo_id} is a local folder, and a Space loads its models from the Hub: "
                f"push it first (`hf-pretrain export ... --push_to_hub ME/NAME`), then give --model ME/NAME",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        try:
            validate_repo_id(repo_id)
        except HFValidationError as exc:
            print(f"hf-pretrain space: {repo_id!r} is not a Hub repo id: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    unwritable = unwritable_reason(args.out.absolute())
    if unwritable:
        print(
            f"hf-pretrain space: cannot write {args.out}: {unwritable}; choose an --out on a writable disk",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        folder = write_space(args.model, args.out, args.title, overwrite=args.overwrite)
    except SpaceRefused as exc:
        print(f"hf-pretrain space: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"space written to {folder} (try it: cd {folder} && python app.py)")
    if args.push:
        url = push_space(folder, args.push, private=True if args.private else None)
        if url is None:
            return EXIT_FAILED
        print(f"pushed: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
