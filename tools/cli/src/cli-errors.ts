/** Exit statuses of the `infermesh` command. */
export const EXIT = {
  ok: 0,
  /** The operation failed: the server refused it, a version FAILED, a wait timed out, an automatic rollout was rolled back or aborted. */
  failed: 1,
  /** The command line is wrong: unknown command or flag, missing or malformed value, no API key. */
  usage: 2,
  /** The gateway cannot be reached (UNAVAILABLE). */
  unreachable: 3,
} as const;

/** An error the CLI reports as `infermesh: <message>` and exits with `exitCode`. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
    this.name = 'CliError';
  }
}

/**
 * A wrong command line. The usage of the command it names is printed after the message; `path` is
 * the command's words (["models", "register"]) when the error knows them, else the command being run.
 */
export class UsageError extends CliError {
  constructor(
    message: string,
    readonly path?: readonly string[],
  ) {
    super(message, EXIT.usage);
    this.name = 'UsageError';
  }
}

/** An operation that did not succeed for a reason the CLI itself saw (a FAILED version, a timeout). */
export class CommandFailure extends CliError {
  constructor(message: string) {
    super(message, EXIT.failed);
    this.name = 'CommandFailure';
  }
}
