"""The object-store room's base: URLs, the file system, secrets kept out of text, the test server itself."""

from __future__ import annotations

import pytest

from hf_pretrain.redaction import redact
from hf_pretrain.store.cache import local_copy
from hf_pretrain.store.urls import StoreUnavailable, StoreURL, filesystem, is_url
from tests.object_store_server import FAKE_SECRET


def test_locations_are_urls_only_with_a_store_scheme(tmp_path):
    assert is_url("s3://bucket/run") and is_url("hf://datasets/me/data")
    assert not is_url("runs/smoke") and not is_url("file:///tmp/x") and not is_url(tmp_path)
    url = StoreURL.parse("s3://bucket/runs/1b/")
    assert (str(url), url.bucket, str(url.join("checkpoints", "step_1/"))) == (
        "s3://bucket/runs/1b",
        "bucket",
        "s3://bucket/runs/1b/checkpoints/step_1",
    )
    assert local_copy(url, "runs", tmp_path) == tmp_path / "runs" / "s3" / "bucket" / "runs" / "1b"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp2://x/y", "is not a store hf-pretrain knows"),
        ("s3://", "names no bucket"),
        # botocore refuses the name itself; parse says so before three retries of a ParamValidationError
        ("s3://Bad_Bucket!/x", "is not a bucket name"),
    ],
)
def test_a_url_this_machine_cannot_use_is_one_line(url, says):
    with pytest.raises(StoreUnavailable, match=says) as refused:
        StoreURL.parse(url)
    assert "\n" not in str(refused.value)


def test_a_cache_dir_that_cannot_be_made_is_one_line_naming_the_flag(tmp_path):
    from hf_pretrain.store.cache import check_cache_root

    (tmp_path / "a_file").write_text("x")
    with pytest.raises(StoreUnavailable, match="set --cache_dir to a folder this machine can write") as refused:
        check_cache_root(tmp_path / "a_file" / "cache")
    assert "\n" not in str(refused.value)
    check_cache_root(tmp_path / "fine" / "cache")  # made, parents and all
    assert (tmp_path / "fine" / "cache").is_dir()


def test_an_unreachable_hub_url_names_the_hubs_settings_not_aws():
    from hf_pretrain.store.reach import describe_failure

    hub = describe_failure(StoreURL.parse("hf://datasets/a/b"), ConnectionError("offline"), "listing the data")
    s3 = describe_failure(StoreURL.parse("s3://a/b"), ConnectionError("refused"), "listing the data")
    assert "AWS_ENDPOINT_URL" not in hub and "HF_HUB_OFFLINE" in hub and "AWS_ENDPOINT_URL" in s3


def test_a_refused_key_names_the_variables_its_own_client_reads():
    """Each scheme's row says which credentials to set: an hf:// or gs:// refusal named AWS's keys."""
    from hf_pretrain.store.reach import describe_failure

    said = {
        scheme: describe_failure(StoreURL.parse(f"{scheme}://a/b"), PermissionError("InvalidToken"), "listing")
        for scheme in ("s3", "gs", "hf")
    }
    assert "AWS_SECRET_ACCESS_KEY" in said["s3"] and "HF_TOKEN" in said["hf"], said
    assert "GOOGLE_APPLICATION_CREDENTIALS" in said["gs"] and "AWS_" not in said["gs"] + said["hf"], said


def test_redaction_masks_every_schemes_credentials_and_only_those():
    """redaction.py is a leaf that imports nothing of the package, so it keeps its own list of secret variables;
    it is the schemes' credential variables, no fewer (a scheme's key would be printed) and no more (a variable
    masked that no store reads is one that no row explains)."""
    from hf_pretrain.redaction import SECRET_VARIABLES
    from hf_pretrain.store.schemes import SCHEMES

    held = [name for scheme in SCHEMES.values() for name in scheme.credential_variables]
    assert sorted(held) == sorted(SECRET_VARIABLES), (held, SECRET_VARIABLES)
    assert all(scheme.credential_variables for scheme in SCHEMES.values())


def test_every_scheme_row_answers_what_the_code_asks_of_it():
    """A row's facts hold together: a conditional write and bounded requests belong to S3's client alone, and
    every scheme's word is also what the typo check and the unknown-scheme line recognise."""
    from hf_pretrain.store.schemes import SCHEMES, scheme_named
    from hf_pretrain.store.urls import client_options, mistyped

    assert scheme_named("s3").conditional_put is not None and scheme_named("s3").bounds_requests
    assert client_options(StoreURL.parse("hf://datasets/a/b")) == {}
    for word in (*SCHEMES, "gcs"):
        assert mistyped(f"{word}:/bkt/x") and mistyped(f"{word}:bkt"), word


def test_redact_masks_held_credentials_and_secret_shapes(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    text = redact(
        f"failed with {FAKE_SECRET} at https://b.s3/x?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA%2F1&part=2 "
        "from s3://user:pw@host/x by hf_abcdefghijklmnopqrstuvwxyz012"
    )
    assert FAKE_SECRET not in text and "deadbeef" not in text and "AKIA%2F1" not in text
    assert ":pw@" not in text and "hf_abcdefghijklmnop" not in text
    assert "part=2" in text and "s3://user:***@host/x" in text  # what is not secret stays readable


def test_the_local_server_round_trips_and_its_outage_is_seen(s3_server, s3_bucket):
    fs = filesystem(StoreURL.parse(s3_bucket))
    path = StoreURL.parse(s3_bucket).join("a.bin").path
    fs.pipe(path, b"x" * 1000)
    assert fs.cat(path) == b"x" * 1000
    from botocore.exceptions import BotoCoreError

    s3_server.proxy.cut()
    try:
        with pytest.raises((OSError, BotoCoreError)):
            filesystem(StoreURL.parse(s3_bucket)).cat(path)
    finally:
        s3_server.proxy.restore()
    assert filesystem(StoreURL.parse(s3_bucket)).cat(path) == b"x" * 1000  # the data outlived the outage
