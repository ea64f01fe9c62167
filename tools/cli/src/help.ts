import { type CommandNode, type FlagSpec, flagsOf } from './args';

const PROGRAM = 'infermesh';

/**
 * The help of a command or group, as printed by `--help`: usage line, summary, the subcommands of a
 * group, and the flags, those declared by the groups above listed apart as global flags.
 */
export function renderHelp<H>(nodes: readonly CommandNode<H>[], path: readonly string[]): string {
  const node = nodes[nodes.length - 1]!;
  const command = [PROGRAM, ...path].join(' ');
  const lines: string[] = [];
  if (node.kind === 'group') {
    lines.push(`Usage: ${command} <command> [flags]`, '', node.summary, '', 'Commands:');
    lines.push(...columns(node.commands.map((c) => [c.name, c.summary])));
  } else {
    const words = [command, ...node.positionals.map((p) => positional(p.name, p.optional === true, p.variadic === true))];
    for (const flag of node.flags) if (flag.required === true) words.push(`--${flag.name} ${flag.placeholder ?? ''}`.trimEnd());
    if (flagsOf(nodes).some((f) => f.required !== true)) words.push('[flags]');
    lines.push(`Usage: ${words.join(' ')}`, '', node.summary);
  }
  // A command's details explain it, right after its summary; a group's (the root's environment) close its help.
  if (node.kind === 'command' && node.details !== undefined) lines.push('', node.details.trimEnd());
  const own = node.kind === 'command' ? node.flags : [];
  const inherited = flagsOf(nodes).filter((f) => !own.includes(f));
  if (own.length > 0) lines.push('', 'Flags:', ...columns(own.map(flagRow)));
  if (inherited.length > 0) lines.push('', own.length > 0 || node.kind === 'command' ? 'Global flags:' : 'Flags:', ...columns(inherited.map(flagRow)));
  if (node.kind === 'group') lines.push('', `Run \`${command} <command> --help\` for the flags of a command.`);
  if (node.kind === 'group' && node.details !== undefined) lines.push('', node.details.trimEnd());
  return `${lines.join('\n')}\n`;
}

function positional(name: string, optional: boolean, variadic: boolean): string {
  const text = variadic ? `${name}...` : name;
  return optional ? `[${text}]` : text;
}

function flagRow(flag: FlagSpec): [string, string] {
  const names = `${flag.short === undefined ? '    ' : `-${flag.short}, `}--${flag.name}${flag.placeholder === undefined ? '' : ` ${flag.placeholder}`}`;
  const repeat = flag.kind === 'list' ? ' (repeatable)' : '';
  return [names, `${flag.description}${repeat}`];
}

/** Two columns, the first padded to its widest cell, indented by two spaces. */
function columns(rows: readonly (readonly [string, string])[]): string[] {
  const width = Math.max(...rows.map(([left]) => left.length));
  return rows.map(([left, right]) => `  ${left.padEnd(width)}  ${right}`.trimEnd());
}
