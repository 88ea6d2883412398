"""factory completion bash|zsh: the shell completion script, made from the command line itself
(every command, its subcommands, its options, their choices; files and directories where an
option takes one), so it never lags behind an option.

    factory completion bash > /etc/bash_completion.d/factory   # or: source <(factory ...)
    factory completion zsh > "${fpath[1]}/_factory"

zsh runs the same completion through its bash emulation (``bashcompinit``).
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh")
FILE_METAVARS = {"FILE", "WHEEL", "DIR|URL", "EXE"}
DIR_METAVARS = {"DIR"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def _options(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, str]]:
    """(every option string, option -> what completes its value: words, 'file' or 'dir')."""
    words: list[str] = []
    values: dict[str, str] = {}
    for action in parser._actions:
        words += action.option_strings
        if not action.option_strings or action.nargs == 0:
            continue
        if action.choices is not None:
            kind = " ".join(map(str, action.choices))
        elif action.metavar in DIR_METAVARS:
            kind = "@dir"
        elif action.metavar in FILE_METAVARS:
            kind = "@file"
        else:
            kind = "@none"
        for option in action.option_strings:
            values[option] = kind
    return words, values


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def bash_script(root: argparse.ArgumentParser) -> str:
    """The completion function: which words complete after the words typed so far."""
    cases_words, cases_values = [], []
    top_words, top_values = _options(root)
    commands = _children(root)
    cases_words.append(f'        "") words={shlex.quote(" ".join([*commands, *top_words]))} ;;')
    for option, kind in top_values.items():
        cases_values.append(f'        "|{option}") kind={shlex.quote(kind)} ;;')
    for name, sub in commands.items():
        words, values = _options(sub)
        nested = _children(sub)
        positional = [str(c) for a in sub._actions if not a.option_strings
                      and a.choices is not None and not isinstance(a, argparse._SubParsersAction)
                      for c in a.choices]
        cases_words.append(f'        "{name}") words='
                           f'{shlex.quote(" ".join([*nested, *positional, *words]))} ;;')
        for option, kind in values.items():
            cases_values.append(f'        "{name}|{option}") kind={shlex.quote(kind)} ;;')
        for child, grand in nested.items():
            child_words, child_values = _options(grand)
            cases_words.append(f'        "{name} {child}") words='
                               f'{shlex.quote(" ".join(child_words))} ;;')
            for option, kind in child_values.items():
                cases_values.append(f'        "{name}|{option}") kind={shlex.quote(kind)} ;;')
    with_subcommands = " ".join(name for name, sub in commands.items() if _children(sub))
    return "\n".join([
        "# factory's shell completion (made by 'factory completion bash')",
        "_factory() {",
        '    local cur prev cmd="" sub="" i word words="" kind=""',
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        word="${COMP_WORDS[i]}"',
        '        case "$word" in -*) continue ;; esac',
        '        if [ -z "$cmd" ]; then cmd="$word"',
        f'        elif [ -z "$sub" ] && [[ " {with_subcommands} " == *" $cmd "* ]]; then'
        ' sub="$word"; fi',
        "    done",
        '    case "$cmd|$prev" in',
        *cases_values,
        "    esac",
        '    case "$kind" in',
        '        "") ;;',
        '        @file) COMPREPLY=($(compgen -f -- "$cur")); return ;;',
        '        @dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;',
        "        @none) COMPREPLY=(); return ;;",
        '        *) COMPREPLY=($(compgen -W "$kind" -- "$cur")); return ;;',
        "    esac",
        '    case "$cmd${sub:+ $sub}" in',
        *cases_words,
        "    esac",
        '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "}",
        "complete -o default -F _factory factory",
        "",
    ])


def zsh_script(root: argparse.ArgumentParser) -> str:
    return "\n".join([
        "#compdef factory",
        "# factory's shell completion for zsh (made by 'factory completion zsh'): the bash one",
        "# through zsh's bash emulation",
        "autoload -U +X bashcompinit && bashcompinit",
        bash_script(root),
    ])


def run(args: argparse.Namespace) -> int:
    root: argparse.ArgumentParser = args._root
    print(bash_script(root) if args.shell == "bash" else zsh_script(root), end="")
    return 0
