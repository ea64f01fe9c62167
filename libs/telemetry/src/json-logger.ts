import type { LoggerService } from '@nestjs/common';
import { pino, type Logger } from 'pino';
import { requestContext } from './request-context';
import { traceIdsOf } from './trace-ids';

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

/**
 * Structured JSON logs on pino, one object a line, carrying the service name, the current request id
 * and, inside a traced request, its `trace_id` and `span_id`, so that a log line leads to its trace.
 * Also Nest's logger, so framework messages come out in the same shape.
 */
export class JsonLogger implements LoggerService {
  private readonly pino: Logger<never, boolean>;

  constructor(
    service: string,
    level: LogLevel = 'info',
    /**
     * Where each line goes, called synchronously with it. pino's own stdout destination buffers and
     * writes asynchronously; a line logged just before the process exits (a fatal error at start-up)
     * would be lost, so the default writes through process.stdout, synchronous for files and pipes.
     */
    write: (line: string) => void = (line) => process.stdout.write(line),
  ) {
    this.pino = pino(
      {
        level,
        base: { service },
        timestamp: pino.stdTimeFunctions.isoTime,
        formatters: { level: (label) => ({ level: label }) },
        // An error argument is written as {message, stack} by emit; pino's serializer would add its type and causes.
        serializers: { err: (err: unknown) => err },
      },
      { write },
    );
  }

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
    if (!this.pino.isLevelEnabled(level)) return;
    const entry: Record<string, unknown> = {};
    const context = requestContext.current();
    if (context !== undefined) {
      entry['request_id'] = context.requestId;
      const ids = traceIdsOf(context.span);
      if (ids !== undefined) {
        entry['trace_id'] = ids.traceId;
        entry['span_id'] = ids.spanId;
      }
    }
    let text: string;
    if (msg instanceof Error) {
      text = msg.message;
      entry['stack'] = msg.stack;
    } else {
      text = typeof msg === 'string' ? msg : JSON.stringify(msg, bigintAsString);
    }
    for (const item of rest) {
      if (item instanceof Error) entry['err'] = { message: item.message, stack: item.stack };
      else if (typeof item === 'string')
        entry['context'] = item; // Nest passes its context name last
      else if (item !== null && typeof item === 'object') Object.assign(entry, withBigintsAsStrings(item));
    }
    this.pino[level](entry, text);
  }
}

function bigintAsString(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? value.toString() : value;
}

/**
 * The value with every bigint, however deep, as its decimal string (as JSON.stringify with a replacer
 * wrote it): pino would write a bare number literal, which JSON readers turn into an imprecise double
 * or reject. Returns the same object when it holds no bigint, so the common case allocates nothing.
 */
function withBigintsAsStrings(value: object, ancestors?: Set<object>): object {
  if (ancestors === undefined) {
    if (isFlatWithoutBigints(value)) return value; // the common case, checked without allocating
    ancestors = new Set();
  } else if (ancestors.has(value)) {
    return value; // a cycle: pino writes it as "[Circular]"
  }
  ancestors.add(value);
  let copy: Record<string, unknown> | undefined;
  for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
    let converted: unknown = item;
    if (typeof item === 'bigint') converted = item.toString();
    else if (item !== null && typeof item === 'object' && !hasToJson(item))
      converted = withBigintsAsStrings(item, ancestors);
    if (converted !== item) {
      copy ??= (Array.isArray(value) ? [...(value as unknown[])] : { ...value }) as Record<string, unknown>;
      copy[key] = converted;
    }
  }
  ancestors.delete(value);
  return copy ?? value;
}

/** Whether no field is a bigint or an object that might hold one. */
function isFlatWithoutBigints(value: object): boolean {
  for (const key in value) {
    const item: unknown = (value as Record<string, unknown>)[key];
    if (typeof item === 'bigint' || (typeof item === 'object' && item !== null)) return false;
  }
  return true;
}

/** A Date, a Buffer or a class with toJSON is written as its toJSON says, not walked. */
function hasToJson(value: object): boolean {
  return typeof (value as { toJSON?: unknown }).toJSON === 'function';
}
