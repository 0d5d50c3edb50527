"""[engines.NAME] tables and engine/served_name on models: parsed with one-line errors; the client's rules."""

from __future__ import annotations

import pytest

from specdec_core.decoding.engine_client import retry_after, shown
from specdec_core.decoding.openai_engine import messages_of
from specdec_core.decoding.registry import EngineSpec, Registry, RegistryError

GOOD = """
[engines.staging]
url = "http://127.0.0.1:8000/v1/"
api_key_env = "STAGING_API_KEY"
timeout_s = 20
max_concurrency = 8

[models.llama-70b]
engine = "staging"
served_name = "meta-llama/Llama-3.1-70B-Instruct"

[models.other-70b]
engine = "staging"

[models.local]
path = "weights/local"
"""


def write(tmp_path, text):
    path = tmp_path / "specdec.toml"
    path.write_text(text)
    return path


def test_an_engine_table_and_the_models_on_it(tmp_path):
    reg = Registry.from_toml(write(tmp_path, GOOD))
    assert reg.engines["staging"] == EngineSpec("staging", "http://127.0.0.1:8000/v1", "STAGING_API_KEY", 20.0, 8)
    assert reg.engine_of("llama-70b") == reg.engine_of("other-70b") == reg.engines["staging"]
    assert reg.engine_of("local") is None and reg.engine_of("unknown") is None
    assert reg.model("llama-70b").model_on_engine == "meta-llama/Llama-3.1-70B-Instruct"
    assert reg.model("other-70b").model_on_engine == "other-70b"  # default: the log's name
    assert reg.model("llama-70b").source == "engine:staging/meta-llama/Llama-3.1-70B-Instruct"
    assert reg.is_available("llama-70b") and not reg.is_available("local")


@pytest.mark.parametrize("text, expected", [
    ('[engines.e]\nurl = "file:///etc/passwd"\n', "[engines.e]: url must be an http:// or https:// address"),
    ('[engines.e]\n', "[engines.e]: url must be"),
    ('[engines.e]\nurl = "http://me:pw@h/v1"\n', "url must not hold credentials"),
    ('[engines.e]\nurl = "http://h/v1"\ntimeout_s = 0\n', "timeout_s must be a number of seconds in (0, 3600]"),
    ('[engines.e]\nurl = "http://h/v1"\nmax_concurrency = 0\n', "max_concurrency must be an integer from 1 to 256"),
    ('[engines.e]\nurl = "http://h/v1"\nmax_concurrency = true\n', "max_concurrency must be an integer"),
    ('[engines.e]\nurl = "http://h/v1"\napi_key_env = "sk-abc def"\n', "api_key_env must name an environment var"),
    ('[engines.e]\nurl = "http://h/v1"\napi_key = "sk-1"\n', "unknown key(s) api_key"),
    ('[models.m]\nengine = "nope"\n', "[models.m]: engine 'nope' has no [engines.nope] table (engines: none)"),
    ('[engines.e]\nurl = "http://h/v1"\n[models.m]\nengine = "e"\npath = "x"\n', "a model on an engine has no local path"),
    ('[models.m]\npath = "x"\nserved_name = "y"\n', "served_name needs engine"),
    ('[engines.e]\nurl = "http://h/v1"\n[models.m]\nengine = "e"\nserved_name = 3\n', "served_name must be a non-empty"),
    ('[engines.e]\nurl = "http://h/v1"\n[models.m]\nengine = "e"\n[tokenizers.t]\nmodel = "m"\n',
     "[tokenizers.t]: model 'm' is on engine e"),
    ('[engines.e]\nurl = "http://127.0.0.1:99999/v1"\n', "url must name a port from 1 to 65535 in ASCII digits"),
    ('[engines.e]\nurl = "http://127.0.0.1:0/v1"\n', "url must name a port from 1 to 65535"),
    ('[engines.e]\nurl = "http://127.0.0.1:\u0668\u0660\u0660\u0660/v1"\n', "in ASCII digits"),
    ('[engines.e]\nurl = "http://127.0.0.1:80x/v1"\n', "url must name a port"),
])
def test_bad_engine_entries_are_one_clear_line(tmp_path, text, expected):
    with pytest.raises(RegistryError) as err:
        Registry.from_toml(write(tmp_path, text))
    message = str(err.value)
    assert expected in message and "\n" not in message
    assert message.startswith(f"{tmp_path}"), "the one line names the file the table is in"


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://[::1]:8000/v1", "https://engine.example/v1",
                                 "http://[::1]/v1"])
def test_a_url_with_a_port_in_range_or_none_is_taken(tmp_path, url):
    reg = Registry.from_toml(write(tmp_path, f'[engines.e]\nurl = "{url}"\n'))
    assert reg.engines["e"].url == url


def test_retry_after_honours_seconds_and_dates_and_caps_them():
    assert retry_after("2", 0) == 2.0
    assert retry_after("Fri, 04 Dec 2026 10:00:05 GMT", 0, now=1796378400.0) == 5.0
    assert retry_after("86400", 0) == 30.0  # a server asking for a day is not waited a day
    assert retry_after(None, 0) < retry_after(None, 3) <= 30.0
    assert retry_after("soon", 1) == retry_after(None, 1)


def test_server_text_is_shown_on_one_escaped_line():
    assert shown("bad\nthing\x1b[31m") == "bad thing\\x1b[31m"
    assert len(shown("x" * 1000)) == 200


def test_a_logged_prompt_of_messages_goes_as_those_messages():
    assert messages_of('[{"role":"system","content":"s"},{"role":"user","content":"u"}]')[1] == {
        "role": "user", "content": "u"}
    assert messages_of('{"messages":[{"role":"user","content":"u"}],"system_instructions":null}') == [
        {"role": "user", "content": "u"}]
    assert messages_of("plain [text]") == [{"role": "user", "content": "plain [text]"}]
