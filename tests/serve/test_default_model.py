"""The default model through `nanoengine serve`: greedy output equals LLM.generate token for token,
and the README's curl and openai examples work as written (on the port the server got)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI
from serving import WAIT, ServeProcess

from nanoengine.llm import LLM
from nanoengine.sampling_params import SamplingParams

pytestmark = pytest.mark.real_model
README = Path(__file__).resolve().parents[2] / "README.md"
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three primary colours."]


@pytest.fixture(scope="module")
def url():
    server = ServeProcess("--model", "default", "--port", "0")
    try:
        yield server.wait_for(" on http://").split(" on ")[1].strip()
    finally:
        server.proc.kill()
        server.proc.wait(timeout=WAIT)


def readme_blocks(language: str) -> list[str]:
    section = README.read_text().split("## Serve\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def on_port(code: str, url: str) -> str:
    return code.replace("http://127.0.0.1:8000", url)


def test_greedy_chat_through_the_server_equals_generate(url):
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    llm = LLM("default", num_threads=1)
    for prompt in PROMPTS:  # one at a time on both sides: the same batches, the same arithmetic
        want = llm.generate([prompt], SamplingParams(max_tokens=48))[0]
        out = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=48,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        choice = out.choices[0]
        assert choice.model_extra["token_ids"] == want.token_ids
        assert choice.model_extra["prompt_token_ids"] == want.prompt_token_ids
        assert choice.message.content == want.text


def test_the_readme_curl_example_works(url):
    curl = [block for block in readme_blocks("bash") if block.startswith("curl")][0]
    out = subprocess.run(["bash", "-c", on_port(curl, url)], capture_output=True, text=True, timeout=WAIT, check=True)
    answer = json.loads(out.stdout)["choices"][0]["message"]["content"]
    assert "Paris" in answer


def test_the_readme_openai_example_works(url):
    code = on_port(readme_blocks("python")[0], url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=True)
    assert len(out.stdout.split()) >= 5 and "Traceback" not in out.stderr
