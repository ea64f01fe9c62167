import { parseDurationMs } from '@infermesh/mesh';
import { UsageError } from './cli-errors';

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

/**
 * Parses a command line against a command tree: the leading words pick a command; flags are
 * `--name value`, `--name=value` or `-h`, anywhere after the word of the group that declares them;
 * `--` ends the flags. Throws a UsageError naming the unknown command or flag, the missing value or
 * argument, or the flag given twice.
 */
export function parseCommandLine<H>(argv: readonly string[], root: GroupSpec<H>): Invocation<H> {
  const nodes: CommandNode<H>[] = [root];
  const path: string[] = [];
  const positionals: string[] = [];
  const values = new Map<string, string[]>();
  let help = false;
  const current = () => nodes[nodes.length - 1]!;
  function fail(message: string): never {
    throw new UsageError(message, path);
  }

  const word = (text: string) => {
    const node = current();
    if (node.kind === 'command') {
      positionals.push(text);
      return;
    }
    const next = node.commands.find((c) => c.name === text);
    if (next === undefined) {
      const where = path.length === 0 ? '' : ` of "${path.join(' ')}"`;
      fail(`unknown command "${text}"${where}; the commands are ${node.commands.map((c) => c.name).join(', ')}`);
    }
    nodes.push(next);
    path.push(text);
  };

  for (let i = 0; i < argv.length; i++) {
    const token = argv[i]!;
    if (token === '--') {
      for (const rest of argv.slice(i + 1)) word(rest);
      break;
    }
    if (!token.startsWith('-') || token === '-' || /^-\d/.test(token)) {
      word(token);
      continue;
    }
    const long = token.startsWith('--');
    const equals = token.indexOf('=');
    const name = long ? token.slice(2, equals < 0 ? undefined : equals) : token.slice(1);
    const inline = long && equals >= 0 ? token.slice(equals + 1) : undefined;
    const accepted = flagsOf(nodes);
    const spec = accepted.find((f) => (long ? f.name === name : f.short === name));
    if (spec === undefined) {
      const command = path.length === 0 ? 'infermesh' : `infermesh ${path.join(' ')}`;
      fail(`unknown flag ${token.split('=')[0]} for "${command}"`);
    }
    const flag = spec;
    if (flag === HELP_FLAG) {
      help = true;
      continue;
    }
    if (flag.kind === 'switch') {
      if (inline !== undefined) fail(`--${flag.name} takes no value`);
      values.set(flag.name, ['true']);
      continue;
    }
    let value = inline;
    if (value === undefined) {
      const next = argv[i + 1];
      if (next === undefined || next.startsWith('--')) fail(`--${flag.name} needs a value ${flag.placeholder ?? ''}`.trimEnd());
      value = next;
      i++;
    }
    const seen = values.get(flag.name);
    if (seen !== undefined && flag.kind === 'value') fail(`--${flag.name} is given more than once`);
    values.set(flag.name, [...(seen ?? []), value]);
  }

  const node = current();
  const args = new ParsedArgs(positionals, values);
  if (help) return { nodes, path, help, args };
  if (node.kind === 'group') {
    fail(path.length === 0 ? 'missing command' : `missing command after "${path.join(' ')}"`);
  } else {
    checkPositionals(node, positionals, fail);
    for (const flag of flagsOf(nodes)) {
      if (flag.required === true && !values.has(flag.name)) fail(`--${flag.name} is required`);
    }
  }
  return { nodes, path, help, args };
}

function checkPositionals<H>(command: CommandSpec<H>, given: readonly string[], fail: (message: string) => never): void {
  const specs = command.positionals;
  const variadic = specs.some((p) => p.variadic === true);
  const required = specs.filter((p) => p.optional !== true);
  if (given.length < required.length) {
    fail(`missing ${required.slice(given.length).map((p) => p.name).join(' ')}`);
  }
  if (!variadic && given.length > specs.length) {
    fail(`unexpected argument "${given[specs.length]}"`);
  }
}

// Values of flags and arguments, checked where they are read: each error names the flag.

/** A positive integer version id, such as "3". */
export function parseVersionId(value: string, what: string): string {
  if (!/^[1-9]\d{0,17}$/.test(value)) throw new UsageError(`${what} must be a positive integer version id, got "${value}"`);
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
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0) throw new UsageError(`${what} must be a number of seconds above 0, got "${value}"`);
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
  if (value.trim() === '' || !Number.isFinite(n) || n < 0) throw new UsageError(`${what} must be a number of requests per second from 0 up, got "${value}"`);
  return n;
}

/** A number from 0 up, decimals allowed, such as `example`. */
export function parseNonNegative(value: string, what: string, example: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0) throw new UsageError(`${what} must be a number from 0 up, such as ${example}, got "${value}"`);
  return n;
}

/** A number above 0, decimals allowed, such as `example`. */
export function parsePositive(value: string, what: string, example: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0) throw new UsageError(`${what} must be a number above 0, such as ${example}, got "${value}"`);
  return n;
}

/** A fraction from 0 to 1, such as `example`. */
export function parseFraction(value: string, what: string, example: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0 || n > 1) throw new UsageError(`${what} must be a fraction from 0 to 1, such as ${example}, got "${value}"`);
  return n;
}

/** A share from 0 to 100, decimals allowed. */
export function parsePercent(value: string, what: string): number {
  const n = Number(value.endsWith('%') ? value.slice(0, -1) : value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0 || n > 100) throw new UsageError(`${what} must be a percent from 0 to 100, got "${value}"`);
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
  return { version: parseVersionId(version, `${what} "${value}": the version`), percent: parsePercent(percent, `${what} "${value}": the percent`) };
}

/**
 * `service=n[,service=n...]`: how many instances of each named service, from 1 to `max`; every
 * service named once, and only from `services`.
 */
export function parseReplicas(value: string, what: string, services: readonly string[], max: number): Map<string, number> {
  const replicas = new Map<string, number>();
  for (const part of value.split(',').map((p) => p.trim()).filter((p) => p !== '')) {
    const [service, count] = parseKeyValue(part, what);
    if (!services.includes(service)) throw new UsageError(`${what} "${part}": ${service} is not a service (${services.join(', ')})`);
    if (replicas.has(service)) throw new UsageError(`${what}: ${service} is named twice`);
    const n = parseInteger(count, `${what} "${part}": the count`, 1);
    if (n > max) throw new UsageError(`${what} "${part}": at most ${max} instances of a service on one machine`);
    replicas.set(service, n);
  }
  if (replicas.size === 0) throw new UsageError(`${what} must look like worker=2, got "${value}"`);
  return replicas;
}
