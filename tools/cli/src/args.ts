import { parseDurationMs } from '@infermesh/mesh';
import { Argument, type Command, type CommanderError, Option } from 'commander';
import { UsageError } from './cli-errors';
import { CliCommand, FLAGS_HEADING, FlagOption, GLOBAL_FLAGS_HEADING } from './help';

/** A flag of a command: `--name <value>`, a repeatable `--label <k=v>`, or a switch `--pin`. */
export interface FlagSpec {
  /** The long name, without the dashes. */
  readonly name: string;
  /** A one-letter alias, without the dash. */
  readonly short?: string;
  /** switch: present or not; value: one value; list: may be given several times. */
  readonly kind: 'switch' | 'value' | 'list';
  /** How the value shows in the usage: "<n>". */
  readonly placeholder?: string;
  readonly required?: boolean;
  readonly description: string;
}

export interface PositionalSpec {
  /** How it shows in the usage: "<file.onnx>". */
  readonly name: string;
  readonly optional?: boolean;
  /** Takes every remaining word; at least one unless optional. */
  readonly variadic?: boolean;
}

/** A command that runs: `infermesh models register`. */
export interface CommandSpec<H> {
  readonly kind: 'command';
  readonly name: string;
  readonly summary: string;
  /** More text for the command's help, after the summary. */
  readonly details?: string;
  readonly positionals: readonly PositionalSpec[];
  readonly flags: readonly FlagSpec[];
  readonly handler: H;
}

/** A word that groups commands: `infermesh models`. Its flags apply to every command under it. */
export interface GroupSpec<H> {
  readonly kind: 'group';
  readonly name: string;
  readonly summary: string;
  readonly details?: string;
  readonly flags: readonly FlagSpec[];
  readonly commands: readonly CommandNode<H>[];
}

export type CommandNode<H> = CommandSpec<H> | GroupSpec<H>;

/** A command spec, its kind filled in. */
export function command<H>(spec: Omit<CommandSpec<H>, 'kind'>): CommandSpec<H> {
  return { kind: 'command', ...spec };
}

/** What a command line asks for. */
export interface Invocation<H> {
  /** The nodes from the root to the one named: [root, models group, register command]. */
  readonly nodes: readonly CommandNode<H>[];
  /** The command words: ["models", "register"]. */
  readonly path: readonly string[];
  /** True when --help or -h was given: print the usage of the last node and run nothing. */
  readonly help: boolean;
  /** With --version: the version to print, and nothing to run. */
  readonly version?: string;
  readonly args: ParsedArgs;
}

/** The flags and positional arguments of a command line, with accessors that check their use. */
export class ParsedArgs {
  constructor(
    readonly positionals: readonly string[],
    private readonly values: ReadonlyMap<string, readonly string[]>,
  ) {}

  /** Whether a flag was given. */
  has(flag: string): boolean {
    return this.values.has(flag);
  }

  /** A switch: true when given. */
  switch(flag: string): boolean {
    return this.values.has(flag);
  }

  /** The value of a flag, or undefined when it was not given. */
  value(flag: string): string | undefined {
    return this.values.get(flag)?.[0];
  }

  /** The value of a flag that must be there (the parser refuses a command line without it). */
  required(flag: string): string {
    const value = this.value(flag);
    if (value === undefined) throw new UsageError(`--${flag} is required`);
    return value;
  }

  /** Every value of a repeatable flag, in order. */
  list(flag: string): readonly string[] {
    return this.values.get(flag) ?? [];
  }
}

const HELP_FLAG: FlagSpec = { name: 'help', short: 'h', kind: 'switch', description: 'Show this help' };

/** The flags a node accepts: its own and those of the groups above it, --help included. */
export function flagsOf<H>(nodes: readonly CommandNode<H>[]): FlagSpec[] {
  return [...nodes.flatMap((node) => node.flags), HELP_FLAG];
}

/** What a commander command of the program stands for. */
interface ProgramCommand<H> {
  /** The nodes from the root to this one. */
  readonly nodes: readonly CommandNode<H>[];
  /** The command words: ["models", "register"]. */
  readonly path: readonly string[];
}

/** A command tree as commander commands. */
export interface Program<H> {
  readonly root: Command;
  readonly commands: ReadonlyMap<Command, ProgramCommand<H>>;
}

/** Options of the program: `version` adds `--version` to the root. */
export interface ProgramOptions {
  readonly version?: string;
}

/**
 * The commander program of a command tree: a group's flags are accepted after its word, by the group
 * and by every command under it (options are positional: `infermesh --version`, but
 * `infermesh models register --version 3`). It writes nothing itself and never exits the process:
 * parseCommandLine turns what it reports into an Invocation or a UsageError.
 */
export function buildProgram<H>(root: GroupSpec<H>, options: ProgramOptions = {}): Program<H> {
  const commands = new Map<Command, ProgramCommand<H>>();
  const add = (cmd: CliCommand, nodes: readonly CommandNode<H>[], path: readonly string[]) => {
    const node = nodes[nodes.length - 1]!;
    commands.set(cmd, { nodes, path });
    cmd
      .enablePositionalOptions()
      .helpCommand(false)
      .allowExcessArguments(false)
      .showSuggestionAfterError(true)
      .exitOverride()
      .configureOutput({ writeOut: () => undefined, writeErr: () => undefined, outputError: () => undefined })
      .summary(node.summary)
      .description(
        node.kind === 'command' && node.details !== undefined
          ? `${node.summary}\n\n${node.details.trimEnd()}`
          : node.summary,
      )
      .usage(usageOf(nodes));
    const own = node.kind === 'command' ? node.flags : [];
    for (const flag of own) cmd.addOption(flagOption(flag, path, FLAGS_HEADING));
    const inheritedHeading = node.kind === 'command' ? GLOBAL_FLAGS_HEADING : FLAGS_HEADING;
    for (const flag of nodes.flatMap((n) => (n === node && node.kind === 'command' ? [] : n.flags)))
      cmd.addOption(flagOption(flag, path, inheritedHeading));
    if (path.length === 0 && options.version !== undefined) {
      cmd.version(options.version, '-V, --version', 'Print the version of infermesh');
      cmd.options.find((o) => o.long === '--version')?.helpGroup(FLAGS_HEADING);
    }
    cmd.addHelpOption(
      new Option(`-${HELP_FLAG.short}, --${HELP_FLAG.name}`, HELP_FLAG.description).helpGroup(inheritedHeading),
    );
    if (node.kind === 'group') {
      const command = ['infermesh', ...path].join(' ');
      cmd.afterHelp = [
        `Run \`${command} <command> --help\` for the flags of a command.`,
        ...(node.details === undefined ? [] : ['', node.details.trimEnd()]),
      ].join('\n');
      for (const child of node.commands) {
        const sub = new CliCommand(child.name);
        cmd.addCommand(sub);
        add(sub, [...nodes, child], [...path, child.name]);
      }
    } else {
      node.positionals.forEach((p, i) =>
        cmd.addArgument(
          new Argument(
            p.optional === true
              ? `[arg${i}${p.variadic === true ? '...' : ''}]`
              : `<arg${i}${p.variadic === true ? '...' : ''}>`,
          ),
        ),
      );
    }
  };
  const program = new CliCommand(root.name);
  add(program, [root], []);
  return { root: program, commands };
}

function usageOf<H>(nodes: readonly CommandNode<H>[]): string {
  const node = nodes[nodes.length - 1]!;
  if (node.kind === 'group') return '<command> [flags]';
  const words = node.positionals.map((p) => positionalUsage(p));
  for (const flag of node.flags)
    if (flag.required === true) words.push(`--${flag.name} ${flag.placeholder ?? ''}`.trimEnd());
  if (flagsOf(nodes).some((f) => f.required !== true)) words.push('[flags]');
  return words.join(' ');
}

function positionalUsage(p: PositionalSpec): string {
  const text = p.variadic === true ? `${p.name}...` : p.name;
  return p.optional === true ? `[${text}]` : text;
}

/** A flag as a commander option; a value flag refuses another flag as its value, and being given twice. */
function flagOption(flag: FlagSpec, path: readonly string[], heading: string): FlagOption {
  const option = new FlagOption(flag);
  option.helpGroup(heading);
  if (flag.kind === 'value') {
    option.argParser((value: string, previous: string | undefined) => {
      checkFlagValue(flag, value, path);
      if (previous !== undefined) throw new UsageError(`--${flag.name} is given more than once`, path);
      return value;
    });
  } else if (flag.kind === 'list') {
    option.argParser((value: string, previous: string[] | undefined) => {
      checkFlagValue(flag, value, path);
      return [...(previous ?? []), value];
    });
  }
  return option;
}

function checkFlagValue(flag: FlagSpec, value: string, path: readonly string[]): void {
  if (value.startsWith('--'))
    throw new UsageError(`--${flag.name} needs a value ${flag.placeholder ?? ''}`.trimEnd(), path);
}

// Words that start with a dash and a digit (-1, -1=2) are arguments, never flags: they travel through
// commander behind this mark.
const WORD_MARK = '\u0000';
const markWord = (word: string) => (/^-\d/.test(word) ? `${WORD_MARK}${word}` : word);
const unmark = (text: string) => text.replaceAll(WORD_MARK, '');

/** commander reported what to show instead of running a command: the help of `at`, or the version. */
class Shown extends Error {
  constructor(
    readonly at: Command,
    readonly version?: string,
  ) {
    super('shown');
  }
}

/** The help of the command named by `path` (as far as its words name commands), as --help prints it. */
export function renderHelp<H>(root: GroupSpec<H>, path: readonly string[], options: ProgramOptions = {}): string {
  let cmd = buildProgram(root, options).root;
  for (const word of path) {
    const next = cmd.commands.find((c) => c.name() === word);
    if (next === undefined) break;
    cmd = next;
  }
  return cmd.helpInformation();
}

/**
 * Parses a command line against a command tree with commander: the leading words pick a command;
 * flags are `--name value`, `--name=value` or `-h`, anywhere after the word of the group that
 * declares them; `--` ends the flags. Throws a UsageError naming the unknown command or flag (with
 * commander's suggestion of a similar one), the missing value or argument, or the flag given twice.
 */
export function parseCommandLine<H>(
  argv: readonly string[],
  root: GroupSpec<H>,
  options: ProgramOptions = {},
): Invocation<H> {
  const { root: program, commands } = buildProgram(root, options);
  const end = argv.indexOf('--');
  const flags = end < 0 ? argv : argv.slice(0, end);
  const help = flags.some((word) => word === '--help' || word === '-h');
  const words = [
    ...flags.filter((word) => word !== '--help' && word !== '-h'),
    ...(end < 0 ? [] : argv.slice(end)),
  ].map(markWord);
  let leaf: Command | undefined;
  for (const [cmd, where] of commands) {
    cmd.exitOverride((error) => {
      throw commanderFailure(error, cmd, where, help);
    });
    // Parsing only: the command is run by the caller, from the Invocation.
    if (where.nodes[where.nodes.length - 1]!.kind === 'command') cmd.action(() => void (leaf = cmd));
  }
  try {
    program.parse(words, { from: 'user' });
  } catch (error) {
    if (!(error instanceof Shown)) throw error;
    const where = commands.get(error.at)!;
    return {
      nodes: where.nodes,
      path: where.path,
      help: error.version === undefined,
      version: error.version,
      args: new ParsedArgs([], new Map()),
    };
  }
  if (leaf === undefined) throw new UsageError('missing command', []);
  const { nodes, path } = commands.get(leaf)!;
  const values = new Map<string, string[]>();
  for (let cmd: Command | null = leaf; cmd !== null; cmd = cmd.parent) {
    for (const option of cmd.options) {
      if (!(option instanceof FlagOption)) continue;
      const value: unknown = cmd.getOptionValue(option.attributeName());
      if (value === undefined) continue;
      const { name, kind } = option.spec;
      // A switch holds true, a value flag its string, a list flag an array of strings (flagOption's parsers).
      const given =
        kind === 'switch' ? ['true'] : (kind === 'list' ? (value as string[]) : [value as string]).map(unmark);
      if (values.has(name) && kind === 'value') throw new UsageError(`--${name} is given more than once`, path);
      values.set(name, [...given, ...(values.get(name) ?? [])]);
    }
  }
  const args = new ParsedArgs(leaf.args.map(unmark), values);
  if (help) return { nodes, path, help, args };
  for (const flag of flagsOf(nodes)) {
    if (flag.required === true && !values.has(flag.name)) throw new UsageError(`--${flag.name} is required`, path);
  }
  return { nodes, path, help, args };
}

/** What commander reports, as infermesh says it; with --help, a missing argument or command shows the help. */
function commanderFailure<H>(error: CommanderError, cmd: Command, where: ProgramCommand<H>, help: boolean): Error {
  const { nodes, path } = where;
  const node = nodes[nodes.length - 1]!;
  const message = unmark(error.message);
  const suggestion = /\n\(Did you mean .+\?\)$/.exec(message)?.[0] ?? '';
  switch (error.code) {
    case 'commander.version':
      return new Shown(cmd, error.message);
    case 'commander.help':
    case 'commander.helpDisplayed':
      // A group without its command.
      return help
        ? new Shown(cmd)
        : new UsageError(path.length === 0 ? 'missing command' : `missing command after "${path.join(' ')}"`, path);
    case 'commander.missingArgument':
    case 'commander.excessArguments': {
      if (help) return new Shown(cmd);
      const specs = node.kind === 'command' ? node.positionals : [];
      const given = cmd.args.map(unmark);
      if (error.code === 'commander.excessArguments')
        return new UsageError(`unexpected argument "${given[specs.length]}"`, path);
      const required = specs.filter((p) => p.optional !== true);
      return new UsageError(
        `missing ${required
          .slice(given.length)
          .map((p) => p.name)
          .join(' ')}`,
        path,
      );
    }
    case 'commander.unknownCommand': {
      const names = node.kind === 'group' ? node.commands.map((c) => c.name) : [];
      const where = path.length === 0 ? '' : ` of "${path.join(' ')}"`;
      return new UsageError(
        `unknown command "${unmark(cmd.args[0] ?? '')}"${where}; the commands are ${names.join(', ')}${suggestion}`,
        path,
      );
    }
    case 'commander.unknownOption': {
      const token = /^error: unknown option '(.*)'/.exec(message)?.[1] ?? message;
      const name = token.split('=')[0]!;
      const known = cmd.options.find((o) => o.long === name);
      if (known !== undefined && token.includes('=')) return new UsageError(`${name} takes no value`, path);
      return new UsageError(`unknown flag ${name} for "${['infermesh', ...path].join(' ')}"${suggestion}`, path);
    }
    case 'commander.optionMissingArgument': {
      const name = /--([^\s',]+)/.exec(message)?.[1];
      const flag = flagsOf(nodes).find((f) => f.name === name);
      return new UsageError(`--${name} needs a value ${flag?.placeholder ?? ''}`.trimEnd(), path);
    }
    default:
      return new UsageError(message.replace(/^error: /, ''), path);
  }
}
// Values of flags and arguments, checked where they are read: each error names the flag.

/** A positive integer version id, such as "3". */
export function parseVersionId(value: string, what: string): string {
  if (!/^[1-9]\d{0,17}$/.test(value))
    throw new UsageError(`${what} must be a positive integer version id, got "${value}"`);
  return value;
}

/** An integer from `min` up. */
export function parseInteger(value: string, what: string, min: number): number {
  const n = Number(value);
  if (!/^-?\d+$/.test(value) || !Number.isSafeInteger(n) || n < min) {
    throw new UsageError(`${what} must be an integer of at least ${min}, got "${value}"`);
  }
  return n;
}

/** A number of seconds greater than zero, decimals allowed. */
export function parseSeconds(value: string, what: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0)
    throw new UsageError(`${what} must be a number of seconds above 0, got "${value}"`);
  return n;
}

/** A duration with its unit, such as 30s, 1m or 500ms (ms, s, m, h), in whole milliseconds from 0 up. */
export function parseDuration(value: string, what: string): number {
  const ms = parseDurationMs(value);
  if (ms === undefined || ms < 0 || !Number.isSafeInteger(ms)) {
    throw new UsageError(`${what} must be a duration with its unit, such as 30s, 1m or 500ms, got "${value}"`);
  }
  return ms;
}

/** A number of requests per second from 0 up, decimals allowed. */
export function parseRate(value: string, what: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0)
    throw new UsageError(`${what} must be a number of requests per second from 0 up, got "${value}"`);
  return n;
}

/** A number from 0 up, decimals allowed, such as `example`. */
export function parseNonNegative(value: string, what: string, example: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0)
    throw new UsageError(`${what} must be a number from 0 up, such as ${example}, got "${value}"`);
  return n;
}

/** A number above 0, decimals allowed, such as `example`. */
export function parsePositive(value: string, what: string, example: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0)
    throw new UsageError(`${what} must be a number above 0, such as ${example}, got "${value}"`);
  return n;
}

/** A fraction from 0 to 1, such as `example`. */
export function parseFraction(value: string, what: string, example: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0 || n > 1)
    throw new UsageError(`${what} must be a fraction from 0 to 1, such as ${example}, got "${value}"`);
  return n;
}

/** A share from 0 to 100, decimals allowed. */
export function parsePercent(value: string, what: string): number {
  const n = Number(value.endsWith('%') ? value.slice(0, -1) : value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0 || n > 100)
    throw new UsageError(`${what} must be a percent from 0 to 100, got "${value}"`);
  return n;
}

/** `key=value`, split at the first "="; the key may not be empty. */
export function parseKeyValue(value: string, what: string): [string, string] {
  const equals = value.indexOf('=');
  if (equals <= 0) throw new UsageError(`${what} must look like key=value, got "${value}"`);
  return [value.slice(0, equals), value.slice(equals + 1)];
}

/** `version=percent`, such as "3=25". */
export function parseVersionShare(value: string, what: string): { version: string; percent: number } {
  const [version, percent] = parseKeyValue(value, what);
  return {
    version: parseVersionId(version, `${what} "${value}": the version`),
    percent: parsePercent(percent, `${what} "${value}": the percent`),
  };
}

/**
 * `service=n[,service=n...]`: how many instances of each named service, from 1 to `max`; every
 * service named once, and only from `services`.
 */
export function parseReplicas(
  value: string,
  what: string,
  services: readonly string[],
  max: number,
): Map<string, number> {
  const replicas = new Map<string, number>();
  for (const part of value
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p !== '')) {
    const [service, count] = parseKeyValue(part, what);
    if (!services.includes(service))
      throw new UsageError(`${what} "${part}": ${service} is not a service (${services.join(', ')})`);
    if (replicas.has(service)) throw new UsageError(`${what}: ${service} is named twice`);
    const n = parseInteger(count, `${what} "${part}": the count`, 1);
    if (n > max) throw new UsageError(`${what} "${part}": at most ${max} instances of a service on one machine`);
    replicas.set(service, n);
  }
  if (replicas.size === 0) throw new UsageError(`${what} must look like worker=2, got "${value}"`);
  return replicas;
}
