import { z } from 'zod';

/** A configuration error: names every variable that is wrong and why. */
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

export type Env = Readonly<Record<string, string | undefined>>;

/**
 * Parses environment variables with a zod object schema whose keys are the variable names. Empty
 * and blank strings count as unset. Throws a ConfigError naming each offending variable and its
 * value.
 */
export function parseEnv<S extends z.ZodRawShape>(shape: S, env: Env): z.infer<z.ZodObject<S>> {
  const input: Record<string, string> = {};
  for (const key of Object.keys(shape)) {
    const value = env[key];
    if (value !== undefined && value.trim() !== '') input[key] = value; // a blank number is not 0
  }
  const result = z.object(shape).safeParse(input);
  if (result.success) return result.data;
  throw new ConfigError(
    result.error.issues.map((issue) => {
      const key = String(issue.path[0] ?? '(root)');
      const got = input[key];
      return `${key}: ${issue.message}${got === undefined ? '' : ` (got ${JSON.stringify(got)})`}`;
    }),
  );
}

/** A TCP port from a variable. */
export const port = (fallback: number) => z.coerce.number().int().min(0).max(65535).default(fallback);

/**
 * A TCP port where another process listens, from a variable that may be unset (undefined: none).
 * Unlike `port`, 0 is refused: "any free port" is for a process's own listener, and no one else can
 * be told where that is.
 */
export const optionalPort = () =>
  z.coerce
    .number()
    .int()
    .min(1, 'expected a port from 1 to 65535')
    .max(65535, 'expected a port from 1 to 65535')
    .optional();

/** A positive integer, e.g. a timeout in milliseconds or a size in bytes. */
export const positiveInt = (fallback: number) => z.coerce.number().int().positive().default(fallback);

/** A non-negative integer. */
export const nonNegativeInt = (fallback: number) => z.coerce.number().int().nonnegative().default(fallback);

const BYTE_UNITS: Readonly<Record<string, number>> = {
  '': 1,
  b: 1,
  kb: 1e3,
  mb: 1e6,
  gb: 1e9,
  tb: 1e12,
  kib: 2 ** 10,
  mib: 2 ** 20,
  gib: 2 ** 30,
  tib: 2 ** 40,
};

/** "512MiB", "2GB", "1.5GiB", "1048576" as a whole number of bytes; undefined when it is not a size. */
export function parseByteSize(value: string): number | undefined {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(value);
  if (match === null) return undefined;
  const unit = BYTE_UNITS[match[2]!.toLowerCase()];
  if (unit === undefined) return undefined;
  const bytes = Math.floor(Number(match[1]) * unit);
  return Number.isSafeInteger(bytes) ? bytes : undefined;
}

/** A size in bytes, written as a number of bytes or with a unit: 512MiB, 2GB, 1.5GiB. */
export const byteSize = (fallback: number | string) =>
  z
    .string()
    .default(String(fallback))
    .transform((value, ctx) => {
      const bytes = parseByteSize(value);
      if (bytes === undefined || bytes <= 0) {
        ctx.addIssue({ code: 'custom', message: 'expected a positive size such as 536870912, 512MiB or 2GB' });
        return z.NEVER;
      }
      return bytes;
    });

/** A host name or address to listen on or connect to. */
export const host = (fallback: string) => z.string().min(1).default(fallback);

/** `host:port` or `[ipv6]:port`, the port at most 65535. */
function isHostPort(value: string): boolean {
  const match = /^(?:[^\s:]+|\[[0-9a-fA-F:]+\]):(\d{1,5})$/.exec(value);
  return match !== null && Number(match[1]) <= 65535;
}

/** A target the mesh resolves: `xds:///<service>` (gRPC's proxyless xDS, through the registry). */
function isXdsTarget(value: string): boolean {
  return /^xds:\/\/\/[a-z][a-z0-9-]{0,62}$/.test(value);
}

/** An upstream address `host:port`. */
export const address = (fallback: string) => z.string().refine(isHostPort, 'expected host:port').default(fallback);

/** An upstream service's address `host:port`, or `xds:///<service>` to reach it through the mesh. */
export const serviceAddress = (fallback: string) =>
  z
    .string()
    .refine((value) => isHostPort(value) || isXdsTarget(value), 'expected host:port or xds:///<service>')
    .default(fallback);

/**
 * Whether a service's calls to an upstream travel carried on one long-lived stream (`true`) or each
 * as a gRPC call of its own (`false`, the default). Read with checkCarried.
 */
export const carried = () => z.enum(['true', 'false']).default('false');

/**
 * The `carried()` flag `variable` as a boolean, once checked against the upstream's address
 * (`addressVariable`): carried calls all go to the one instance their stream reached, so they cannot
 * go through the mesh's `xds:///` targets, which balance, retry and split each call.
 */
export function checkCarried(
  variable: string,
  value: 'true' | 'false',
  addressVariable: string,
  address: string,
): boolean {
  if (value === 'true' && isXdsTarget(address)) {
    throw new ConfigError([
      `${variable}: true sends every call on one stream to one instance, but ${addressVariable} is ${address}, the mesh, which balances, retries and splits each call: set ${variable}=false`,
    ]);
  }
  return value === 'true';
}

/** A comma-separated list of upstream addresses. */
export const addressList = (fallback: string) =>
  z
    .string()
    .default(fallback)
    .transform((value) =>
      value
        .split(',')
        .map((a) => a.trim())
        .filter((a) => a.length > 0),
    )
    .pipe(z.array(z.string().refine(isHostPort, 'expected host:port')).min(1));

export const logLevel = () => z.enum(['debug', 'info', 'warn', 'error']).default('info');

/** An optional redis:// or rediss:// URL. */
export const redisUrl = () =>
  z
    .string()
    .regex(/^rediss?:\/\//, 'expected a redis:// or rediss:// URL')
    .optional();

/**
 * Loads a service's configuration once at start-up; on error prints the problems and exits, so a
 * bad value stops the service with a message naming the variable.
 */
export function loadOrExit<T>(service: string, load: () => T): T {
  try {
    return load();
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(
        `${JSON.stringify({ level: 'fatal', service, msg: error.message, problems: error.problems })}\n`,
      );
      process.exit(78); // EX_CONFIG
    }
    throw error;
  }
}

/** A field's path as a validation issue gives it (`edges[1].retry.attempts`), for messages that name the field. */
export function fieldPath(path: readonly PropertyKey[]): string {
  return path.reduce<string>(
    (text, part) =>
      typeof part === 'number' ? `${text}[${part}]` : text === '' ? String(part) : `${text}.${String(part)}`,
    '',
  );
}
