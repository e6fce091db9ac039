"""``trainwarden completion bash|zsh|fish``: shell completion made from the
argument parser itself, so every command and option (those added by the
command modules too) completes without a list kept by hand."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

SHELLS = ("bash", "zsh", "fish")
# Values that are paths: completed with file names.
_PATHLIKE = ("file", "dir", "store", "rules", "log", "path", "notifications", "market", "failures", "conf")


@dataclasses.dataclass
class Option:
    strings: list[str]
    help: str
    takes_value: bool
    choices: list[str]
    files: bool

    @property
    def value(self) -> str:
        """What follows the option: "choices", "files", "text" or nothing ("")."""
        if self.choices:
            return "choices"
        if self.files:
            return "files"
        return "text" if self.takes_value else ""


@dataclasses.dataclass
class Command:
    path: str  # "" for the top level, "rules validate" for a nested one
    commands: list[tuple[str, str]]  # (name, help) of its subcommands
    options: list[Option]
    positional_choices: list[str]
    positional_files: bool


def _choices(action: argparse.Action) -> list[str]:
    # A type that checks the values itself (an option read from the environment
    # too) may say which it accepts in a ``choices`` attribute.
    return [str(c) for c in action.choices or getattr(action.type, "choices", None) or ()]


def _is_pathlike(action: argparse.Action) -> bool:
    if _choices(action):
        return False
    words = f"{action.dest} {action.metavar or ''}".lower()
    return any(word in words for word in _PATHLIKE)


def walk(parser: argparse.ArgumentParser, path: str = "") -> list[Command]:
    """Every parser of the tree, the top one first."""
    here = Command(path, [], [], [], False)
    below: list[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                here.commands.append((name, helps.get(name, "")))
                below.extend(walk(sub, f"{path} {name}".strip()))
        elif action.option_strings:
            here.options.append(Option(list(action.option_strings), action.help or "", action.nargs != 0,
                                       _choices(action), _is_pathlike(action)))
        else:
            here.positional_choices.extend(_choices(action))
            here.positional_files = here.positional_files or _is_pathlike(action)
    return [here, *below]


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    tree = walk(parser)
    prog = parser.prog
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](tree, prog)


def _fn(prog: str) -> str:
    return "_" + "".join(c if c.isalnum() else "_" for c in prog)


def _words(items) -> str:
    return shlex.quote(" ".join(items))


def _bash(tree: list[Command], prog: str) -> str:
    fn = _fn(prog)
    spec, choices = [], []
    for node in tree:
        valued = [s for o in node.options if o.takes_value for s in o.strings]
        files = [s for o in node.options if o.files for s in o.strings]
        spec.append(f"        {shlex.quote(node.path)}) commands={_words(n for n, _ in node.commands)}; "
                    f"options={_words(s for o in node.options for s in o.strings)}; "
                    f"valued={shlex.quote(' ' + ' '.join(valued) + ' ')}; "
                    f"files={shlex.quote(' ' + ' '.join(files) + ' ')}; "
                    f"positional={_words(node.positional_choices)}; "
                    f"positional_files={'1' if node.positional_files else ''} ;;")
        for option in node.options:
            if option.choices:
                for string in option.strings:
                    choices.append(f"        {shlex.quote(node.path + '|' + string)}) "
                                   f"echo {_words(option.choices)} ;;")
    return f"""# bash completion for {prog} (made by '{prog} completion bash')
{fn}_spec() {{
    commands=; options=; valued=; files=; positional=; positional_files=
    case "$1" in
{chr(10).join(spec)}
    esac
}}

{fn}_choices() {{
    case "$1|$2" in
{chr(10).join(choices)}
    esac
}}

{fn}() {{
    local cur prev path word i commands options valued files positional positional_files
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    path=""
    i=1
    while [ "$i" -lt "$COMP_CWORD" ]; do
        word="${{COMP_WORDS[i]}}"
        if [ "$word" = "--" ]; then
            # The job's own command follows: complete file names.
            COMPREPLY=( $(compgen -f -- "$cur") )
            return 0
        fi
        {fn}_spec "$path"
        case "$word" in
            -*) case "$valued" in *" $word "*) i=$((i + 1)) ;; esac ;;
            *) case " $commands " in *" $word "*) path="${{path:+$path }}$word" ;; esac ;;
        esac
        i=$((i + 1))
    done
    {fn}_spec "$path"
    case "$valued" in
        *" $prev "*)
            local values
            values="$({fn}_choices "$path" "$prev")"
            if [ -n "$values" ]; then
                COMPREPLY=( $(compgen -W "$values" -- "$cur") )
            else
                case "$files" in
                    *" $prev "*) COMPREPLY=( $(compgen -f -- "$cur") ) ;;
                    *) COMPREPLY=() ;;
                esac
            fi
            return 0 ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=( $(compgen -W "$options" -- "$cur") )
    elif [ -n "$commands" ]; then
        COMPREPLY=( $(compgen -W "$commands" -- "$cur") )
    elif [ -n "$positional" ]; then
        COMPREPLY=( $(compgen -W "$positional" -- "$cur") )
    elif [ -n "$positional_files" ]; then
        COMPREPLY=( $(compgen -f -- "$cur") )
    else
        COMPREPLY=()
    fi
    return 0
}}

complete -o filenames -F {fn} {prog}
"""


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh_text(text: str) -> str:
    """Help text inside _arguments' brackets and _describe's name:text pairs."""
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def _zsh_option(option: Option) -> str:
    names = option.strings
    exclusive = f"({' '.join(names)})" if len(names) > 1 else ""
    value = {"choices": f":value:({' '.join(option.choices)})", "files": ":path:_files", "text": ":value: ",
             "": ""}[option.value]
    spec = f"[{_zsh_text(option.help)}]{value}"
    if len(names) == 1:
        return _zsh_quote(names[0] + spec)
    return f"{_zsh_quote(exclusive)}{{{','.join(names)}}}{_zsh_quote(spec)}"


def _zsh(tree: list[Command], prog: str) -> str:
    fn = _fn(prog)
    spec, cases = [], []
    for node in tree:
        valued = [s for o in node.options if o.takes_value for s in o.strings]
        spec.append(f"        {_zsh_quote(node.path)}) commands=({' '.join(n for n, _ in node.commands)}); "
                    f"valued={_zsh_quote(' ' + ' '.join(valued) + ' ')} ;;")
        args = [_zsh_option(o) for o in node.options]
        body = ""
        if node.commands:
            args.append("'1: :->command'")
            pairs = " ".join(_zsh_quote(f"{_zsh_text(n)}:{h}") for n, h in node.commands)
            body = f"\n            [[ $state == command ]] && {{ local -a cmds; cmds=({pairs}); " \
                   "_describe command cmds; }"
        elif node.positional_choices:
            args.append(_zsh_quote(f"*:value:({' '.join(node.positional_choices)})"))
        elif node.positional_files:
            args.append("'*:path:_files'")
        cases.append(f"        {_zsh_quote(node.path)})\n            _arguments -s -S {' '.join(args)}{body} ;;")
    return f"""#compdef {prog}
# zsh completion for {prog} (made by '{prog} completion zsh'); source it or put it in $fpath as _{prog}
{fn}_spec() {{
    commands=(); valued=''
    case "$1" in
{chr(10).join(spec)}
    esac
}}

{fn}() {{
    # Not "path": zsh ties that name to $PATH.
    local cmdpath='' word cut=1 i=2 valued context state state_descr line
    local -a commands
    typeset -A opt_args
    while (( i < CURRENT )); do
        word=${{words[i]}}
        if [[ $word == -- ]]; then
            _files  # the job's own command follows
            return
        fi
        {fn}_spec "$cmdpath"
        case $word in
            -*) [[ $valued == *" $word "* ]] && (( i++ )) ;;
            *) if (( ${{commands[(Ie)$word]}} )); then cmdpath=${{cmdpath:+$cmdpath }}$word; cut=$i; fi ;;
        esac
        (( i++ ))
    done
    # _arguments sees the innermost command as if it were typed alone.
    if (( cut > 1 )); then
        words=("${{(@)words[cut,-1]}}")
        (( CURRENT -= cut - 1 ))
    fi
    case "$cmdpath" in
{chr(10).join(cases)}
    esac
}}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    {fn} "$@"
else
    compdef {fn} {prog}
fi
"""


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(tree: list[Command], prog: str) -> str:
    fn = _fn(prog).lstrip("_") + "_path"
    commands = "\n".join(f"        case {_fish_quote(node.path)}\n            echo {_fish_quote(' '.join(n for n, _ in node.commands))}"
                         for node in tree if node.commands)
    lines = [f"# fish completion for {prog} (made by '{prog} completion fish')",
             f"function __{fn}_commands",
             "    switch \"$argv[1]\"",
             commands,
             "    end",
             "end",
             "",
             f"function __{fn}",
             "    set -l path ''",
             "    for word in (commandline -opc)[2..-1]",
             "        if test \"$word\" = '--'",
             "            echo '--'",
             "            return",
             "        end",
             f"        if contains -- $word (string split ' ' (__{fn}_commands \"$path\"))",
             "            set path (string trim \"$path $word\")",
             "        end",
             "    end",
             "    echo $path",
             "end",
             "",
             f"complete -c {prog} -f"]
    for node in tree:
        when = f"-n {_fish_quote(f'test (__{fn}) = {_fish_quote(node.path)}')}"
        for name, text in node.commands:
            lines.append(f"complete -c {prog} {when} -a {_fish_quote(name)} -d {_fish_quote(text)}")
        for option in node.options:
            flags = " ".join(f"-l {s[2:]}" if s.startswith("--") else f"-s {s[1:]}" for s in option.strings)
            value = {"choices": f" -x -a {_fish_quote(' '.join(option.choices))}", "files": " -r -F",
                     "text": " -x", "": ""}[option.value]
            lines.append(f"complete -c {prog} {when} {flags}{value} -d {_fish_quote(option.help[:80])}")
        if node.positional_choices:
            lines.append(f"complete -c {prog} {when} -a {_fish_quote(' '.join(node.positional_choices))}")
        elif node.positional_files:
            lines.append(f"complete -c {prog} {when} -F")
    lines.append(f"complete -c {prog} -n {_fish_quote(f'test (__{fn}) = --')} -F")
    return "\n".join(lines) + "\n"
