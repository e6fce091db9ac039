"""Shell completion made from the parser: it completes in a real bash, and the zsh and fish scripts parse."""

import importlib.metadata
import shutil
import subprocess

import pytest

from trainwarden.cli.completion import walk
from trainwarden.cli.main import build_parser


def _script(cli, shell: str, tmp_path):
    result = cli("completion", shell)
    assert result.code == 0, result
    path = tmp_path / f"trainwarden.{shell}"
    path.write_text(result.out)
    return path


def _bash_complete(script, *words: str) -> list[str]:
    """What bash offers for the last word, the completion function called as bash calls it."""
    quoted = " ".join(f"'{w}'" for w in words)
    program = (f"source '{script}'\nCOMP_WORDS=(trainwarden {quoted})\nCOMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n"
               "_trainwarden\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_bash_completes_commands_options_and_choices_including_the_cluster_commands(cli, tmp_path):
    script = _script(cli, "bash", tmp_path)
    assert "history" in _bash_complete(script, "hi") and "submit" in _bash_complete(script, "sub")
    assert _bash_complete(script, "rules", "") == ["validate", "test"]
    assert _bash_complete(script, "history", "--so") == ["--source"]
    assert "hang" in _bash_complete(script, "history", "--source", "")
    assert _bash_complete(script, "history", "-o", "") == ["table", "wide", "json", "name"]
    assert _bash_complete(script, "submit", "--fol") == ["--follow"]
    assert _bash_complete(script, "nodes", "") == ["list", "isolate", "uncordon"]
    # An option's value is not taken for a command: 'run' here is a job id.
    assert _bash_complete(script, "history", "--job", "run", "--agg") == ["--aggregate"]
    assert _bash_complete(script, "completion", "") == ["bash", "zsh", "fish"]


def test_every_option_of_every_command_is_in_the_script(cli, tmp_path):
    text = _script(cli, "bash", tmp_path).read_text()
    tree = walk(build_parser())
    assert {"rules validate", "notify log", "kafka init", "submit", "completion"} <= {c.path for c in tree}
    for command in tree:
        for option in command.options:
            for string in option.strings:
                assert string in text, (command.path, string)


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_the_zsh_and_fish_scripts_parse(cli, tmp_path, shell):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here (apt-get install {shell})")
    script = _script(cli, shell, tmp_path)
    checked = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_fish_completes_an_option_with_its_help(cli, tmp_path):
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed here (apt-get install fish)")
    script = _script(cli, "fish", tmp_path)
    done = subprocess.run(["fish", "--no-config", "-c", f"source '{script}'; complete -C 'trainwarden history --so'"],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.startswith("--source\tonly faults of this error source"), done


def test_version_is_the_installed_distributions(cli):
    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"trainwarden {importlib.metadata.version('trainwarden')}"


def test_zsh_completes_subcommands_with_their_help_on_a_real_terminal(cli, tmp_path):
    """zsh completes only in an interactive shell: one in tmux, Tab typed, the screen read."""
    import time
    import uuid

    if shutil.which("zsh") is None or shutil.which("tmux") is None:
        pytest.skip("zsh or tmux is not installed here (apt-get install zsh tmux)")
    script = _script(cli, "zsh", tmp_path)
    home = tmp_path / "zdot"
    home.mkdir()
    (home / ".zshrc").write_text(f"autoload -U compinit && compinit -u\nsource '{script}'\nPS1='> '\n")
    session = f"twz-{uuid.uuid4().hex[:8]}"
    server = ["tmux", "-S", str(tmp_path / "tmux.sock")]  # a server of its own: no race with another's exiting
    env = f"env -i HOME={home} ZDOTDIR={home} TERM=xterm PATH=/usr/bin:/bin zsh"  # completing runs nothing
    subprocess.run([*server, "new-session", "-d", "-s", session, "-x", "150", "-y", "30", env], check=True)
    try:
        screen = ""
        for keys in (["trainwarden rul", "Tab"], ["Tab"]):
            subprocess.run([*server, "send-keys", "-t", session, *keys], check=True)
            time.sleep(0.5)
        deadline = time.time() + 20
        while time.time() < deadline and "validate  --" not in screen:
            time.sleep(0.3)
            screen = subprocess.run([*server, "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True).stdout
        assert "> trainwarden rules" in screen, screen
        assert "validate  -- load rule files strictly" in screen and "test      -- run rule unit tests" in screen
    finally:
        subprocess.run([*server, "kill-server"], capture_output=True)
