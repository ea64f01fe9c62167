import type { LoggerService } from '@nestjs/common';
import { requestContext } from './request-context';

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

/**
 * Structured JSON logs, one object a line on stdout, carrying the service name and the current
 * request id. Also Nest's logger, so framework messages come out in the same shape.
 */
export class JsonLogger implements LoggerService {
  constructor(
    private readonly service: string,
    private readonly level: LogLevel = 'info',
    private readonly write: (line: string) => void = (line) => process.stdout.write(line),
  ) {}

  debug(msg: unknown, ...rest: unknown[]): void {
    this.emit('debug', msg, rest);
  }
  log(msg: unknown, ...rest: unknown[]): void {
    this.emit('info', msg, rest);
  }
  info(msg: unknown, fields?: Record<string, unknown>): void {
    this.emit('info', msg, fields === undefined ? [] : [fields]);
  }
  warn(msg: unknown, ...rest: unknown[]): void {
    this.emit('warn', msg, rest);
  }
  error(msg: unknown, ...rest: unknown[]): void {
    this.emit('error', msg, rest);
  }
  verbose(msg: unknown, ...rest: unknown[]): void {
    this.emit('debug', msg, rest);
  }

  private emit(level: LogLevel, msg: unknown, rest: unknown[]): void {
    if (rank[level] < rank[this.level]) return;
    const entry: Record<string, unknown> = { time: new Date().toISOString(), level, service: this.service };
    const requestId = requestContext.current()?.requestId;
    if (requestId !== undefined) entry['request_id'] = requestId;
    if (msg instanceof Error) {
      entry['msg'] = msg.message;
      entry['stack'] = msg.stack;
    } else {
      entry['msg'] = typeof msg === 'string' ? msg : JSON.stringify(msg);
    }
    for (const item of rest) {
      if (item instanceof Error) entry['err'] = { message: item.message, stack: item.stack };
      else if (typeof item === 'string') entry['context'] = item; // Nest passes its context name last
      else if (item !== null && typeof item === 'object') Object.assign(entry, item);
    }
    this.write(`${JSON.stringify(entry, bigintSafe)}\n`);
  }
}

function bigintSafe(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? value.toString() : value;
}
