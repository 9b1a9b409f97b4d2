"""`gpurm completion bash|zsh`: a shell completion script generated from the CLI's own parser, so it never falls
behind a new command or flag. It completes commands, subcommands (`admin pki issue`), flags, a flag's choices
(`--state RUNNING`), file names where a command takes a file, and job ids (from `gpurm jobs -o json`) where it
takes a job."""

from __future__ import annotations

import argparse

JOB_COMMANDS = ("status", "logs", "kill", "wait", "scale")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, path: str, out: dict[str, tuple[list[str], dict[str, list[str]]]]) -> None:
    """For each command path ('' for the top, 'admin pki' ...): its words (subcommands and flags) and the
    choices of its flags that take them."""
    subs = _subparsers(parser)
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--") or len(s) == 2]
    choices = {s: [str(c) for c in a.choices] for a in parser._actions if a.option_strings and a.choices
               for s in a.option_strings}
    out[path] = (sorted(subs) + sorted(set(flags)), choices)
    for name, sub in subs.items():
        _walk(sub, f"{path} {name}".strip(), out)


def bash_script(parser: argparse.ArgumentParser) -> str:
    table: dict[str, tuple[list[str], dict[str, list[str]]]] = {}
    _walk(parser, "", table)
    words_cases = "\n".join(f'        "{path}") words="{" ".join(words)}" ;;' for path, (words, _) in table.items())
    choice_cases = "\n".join(f'        "{path}|{flag}") COMPREPLY=($(compgen -W "{" ".join(values)}" -- "$cur")); '
                             "return ;;"
                             for path, (_, choices) in table.items() for flag, values in choices.items())
    nested = sorted({p for p in table if p})
    return f"""# gpurm completion for bash: eval "$(gpurm completion bash)" (e.g. in ~/.bashrc)
_gpurm() {{
    local cur prev path="" i w words
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        [[ "$w" == -* ]] && continue
        case " {' '.join(f'|{p}|' for p in nested)} " in
            *"|${{path:+$path }}$w|"*) path="${{path:+$path }}$w" ;;
        esac
    done
    case "$path|$prev" in
{choice_cases}
    esac
    case "$path" in
{words_cases}
        *) words="" ;;
    esac
    if [[ "$cur" != -* ]]; then
        case "$path" in
            {"|".join(JOB_COMMANDS)})
                words="$words $(gpurm jobs -o json 2>/dev/null | sed -n 's/.*"job_id": "\\([^"]*\\)".*/\\1/p')" ;;
            submit|check-queues|"admin refresh-queues"|sim)
                COMPREPLY=($(compgen -f -- "$cur")) ;;
        esac
    fi
    COMPREPLY+=($(compgen -W "$words" -- "$cur"))
}}
complete -F _gpurm gpurm
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return ("# gpurm completion for zsh: eval \"$(gpurm completion zsh)\" (e.g. in ~/.zshrc)\n"
            "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n"
            + bash_script(parser).split("\n", 1)[1])


def cmd_completion(args: argparse.Namespace) -> int:
    from gpurm.cli.main import build_parser

    parser = build_parser()
    print(bash_script(parser) if args.shell == "bash" else zsh_script(parser), end="")
    return 0
