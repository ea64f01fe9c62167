import type { DescMessage, MessageShape } from '@bufbuild/protobuf';
import { type Clock, systemClock } from '@infermesh/clock';
import type { ParsedArgs } from './args';
import { loadGatewayClientConfig } from './cli.config';
import { CliError, EXIT } from './cli-errors';
import type { CliIo } from './cli-io';
import { GatewaySession } from './gateway-session';
import { toJsonText } from './output/format';

/** What a command runs with: its arguments, the process's streams, and the gateway once asked for. */
export class CommandContext {
  private session: GatewaySession | undefined;
  private address: string | undefined;

  constructor(
    readonly io: CliIo,
    readonly args: ParsedArgs,
  ) {}

  /** The time of --timeout waits and of what is shown against now. */
  get clock(): Clock {
    return this.io.clock ?? systemClock;
  }

  /** --json: the protobuf JSON of the result on stdout, and no progress. */
  get json(): boolean {
    return this.args.switch('json');
  }

  /** Progress and notes for a person, on stderr; nothing with --json. */
  note(text: string): void {
    if (!this.json) this.io.stderr.write(text);
  }

  /** The result on stdout: its protobuf JSON with --json, else the readable text. */
  result<D extends DescMessage>(schema: D, message: MessageShape<D>, readable: () => string): void {
    this.io.stdout.write(this.json ? toJsonText(schema, message) : readable());
  }

  /**
   * The gateway's admin API, from --gateway/INFERMESH_GATEWAY and --api-key/INFERMESH_API_KEY (read
   * once). No key is a usage error.
   */
  gateway(): GatewaySession {
    if (this.session === undefined) {
      const config = loadGatewayClientConfig(this.io.env, {
        gateway: this.args.value('gateway'),
        apiKey: this.args.value('api-key'),
      });
      if (config.apiKey === undefined) {
        throw new CliError(
          'no API key: pass --api-key <key> or set INFERMESH_API_KEY (an admin key of the gateway; `infermesh up` prints the one it uses)',
          EXIT.usage,
        );
      }
      this.address = config.gateway;
      this.session = new GatewaySession(config.gateway, config.apiKey);
    }
    return this.session;
  }

  /** The gateway's address, once gateway() has read it. */
  get gatewayAddress(): string | undefined {
    return this.address;
  }

  /** Closes the connection to the gateway, if one was opened. */
  close(): void {
    this.session?.close();
    this.session = undefined;
  }
}

/** A command's body. It throws to fail: CliError with its exit status, RpcError for a refused call. */
export type CommandHandler = (context: CommandContext) => Promise<void>;
