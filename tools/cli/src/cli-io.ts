import type { Clock } from '@infermesh/clock';
import type { Env } from '@infermesh/config';

/** Where the CLI writes text: process.stdout and process.stderr, or a buffer in the specs. */
export interface TextSink {
  write(text: string): unknown;
  /** True when a person watches it: progress bars redraw in place only then. */
  readonly isTTY?: boolean;
}

/** What the CLI takes from its process, injected so that specs run it in-process. */
export interface CliIo {
  readonly env: Env;
  readonly stdout: TextSink;
  readonly stderr: TextSink;
  /** The compiled repository (dist/) that `infermesh up` starts the services from. */
  readonly distDir: string;
  /** The time that --timeout waits follow and that times are shown against; systemClock when absent. */
  readonly clock?: Clock;
}
