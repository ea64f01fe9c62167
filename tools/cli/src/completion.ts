import type { Command } from 'commander';

/** The shells `infermesh completion` writes a script for. */
export const SHELLS = ['bash', 'zsh'] as const;
export type Shell = (typeof SHELLS)[number];

export function isShell(value: string): value is Shell {
  return (SHELLS as readonly string[]).includes(value);
}

/** What completes after the words of one command: its subcommands and flags. */
interface CompletionEntry {
  /** The command words: "models register"; "" for the program itself. */
  readonly path: string;
  readonly words: readonly string[];
  /** A command that runs (its arguments are often files), not a group. */
  readonly leaf: boolean;
}

/** The entries of `cmd` and every command under it, from commander's tree and its help's visible items. */
function entriesOf(cmd: Command, path: readonly string[] = []): CompletionEntry[] {
  const help = cmd.createHelp();
  const subcommands = help.visibleCommands(cmd);
  const flags = help.visibleOptions(cmd).flatMap((option) => (option.long === undefined ? [] : [option.long]));
  const entry = {
    path: path.join(' '),
    words: [...subcommands.map((sub) => sub.name()), ...flags],
    leaf: subcommands.length === 0,
  };
  return [entry, ...subcommands.flatMap((sub) => entriesOf(sub, [...path, sub.name()]))];
}

/** A word in single quotes for the shell. */
const quote = (word: string) => `'${word.replaceAll("'", `'\\''`)}'`;

/**
 * The completion script of `program` for `shell`: after the command words typed so far it offers the
 * subcommands and flags of the command they name, and files for a command's arguments.
 */
export function completionScript(shell: Shell, program: Command): string {
  const name = program.name();
  const fn = `_${name.replace(/[^A-Za-z0-9_]/g, '_')}`;
  const entries = entriesOf(program);
  const commandPaths = entries
    .filter((e) => e.path !== '')
    .map((e) => quote(e.path))
    .join('|');
  switch (shell) {
    case 'bash':
      return [
        `# ${name} completion for bash: \`source <(${name} completion bash)\` in ~/.bashrc.`,
        `${fn}() {`,
        '  local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" word i words=""',
        '  for ((i = 1; i < COMP_CWORD; i++)); do',
        '    word="${COMP_WORDS[i]}"',
        '    case "${cmd:+$cmd }$word" in',
        `      ${commandPaths}) cmd="\${cmd:+$cmd }$word" ;;`,
        '    esac',
        '  done',
        '  case "$cmd" in',
        ...entries.map((e) => `    ${quote(e.path)}) words=${quote(e.words.join(' '))} ;;`),
        '  esac',
        '  COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        '}',
        `complete -o default -F ${fn} ${name}`,
        '',
      ].join('\n');
    case 'zsh':
      return [
        `#compdef ${name}`,
        `# ${name} completion for zsh: \`source <(${name} completion zsh)\` in ~/.zshrc after compinit, or save it as`,
        `# ${fn} in a directory of $fpath.`,
        `${fn}() {`,
        '  local cmd="" word i leaf=""',
        '  local -a candidates',
        '  for ((i = 2; i < CURRENT; i++)); do',
        '    word="${words[i]}"',
        '    case "${cmd:+$cmd }$word" in',
        `      (${commandPaths}) cmd="\${cmd:+$cmd }$word" ;;`,
        '    esac',
        '  done',
        '  case "$cmd" in',
        ...entries.map(
          (e) => `    (${quote(e.path)}) candidates=(${e.words.map(quote).join(' ')})${e.leaf ? '; leaf=1' : ''} ;;`,
        ),
        '  esac',
        '  compadd -a candidates',
        '  if [[ -n $leaf && $PREFIX != -* ]]; then _files; fi',
        '}',
        `if [[ $funcstack[1] == ${fn} ]]; then ${fn} "$@"; else compdef ${fn} ${name}; fi`,
        '',
      ].join('\n');
  }
}
