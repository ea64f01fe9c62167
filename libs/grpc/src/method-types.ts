import type { DescMessage, DescService, MessageInitShape, MessageShape } from '@bufbuild/protobuf';

type MethodShape = { input: DescMessage; output: DescMessage; methodKind: string };
type Methods<S extends DescService> = S['method'];

/** What a handler sees of its call besides the request. */
export interface CallContext {
  readonly requestId: string;
  /** Epoch milliseconds; undefined when the caller set no deadline. */
  readonly deadlineMs: number | undefined;
  /** Aborted when the client cancels or the deadline passes. */
  readonly signal: AbortSignal;
  /** Incoming metadata, lower-case keys, string values. */
  readonly metadata: Readonly<Record<string, string>>;
  /** The encoded size of a unary or server-streaming call's request message, as received. */
  readonly requestBytes?: number;
}

export type HandlerFor<M extends MethodShape> = M['methodKind'] extends 'unary'
  ? (request: MessageShape<M['input']>, ctx: CallContext) => Promise<MessageInitShape<M['output']>>
  : M['methodKind'] extends 'server_streaming'
    ? (request: MessageShape<M['input']>, ctx: CallContext) => AsyncIterable<MessageInitShape<M['output']>>
    : M['methodKind'] extends 'client_streaming'
      ? (requests: AsyncIterable<MessageShape<M['input']>>, ctx: CallContext) => Promise<MessageInitShape<M['output']>>
      : M['methodKind'] extends 'bidi_streaming'
        ? (
            requests: AsyncIterable<MessageShape<M['input']>>,
            ctx: CallContext,
          ) => AsyncIterable<MessageInitShape<M['output']>>
        : never;

/**
 * A server implementation of a generated service: one async handler per method. Streaming requests
 * come as an async iterable that throws INVALID_ARGUMENT on a malformed message and CANCELLED when
 * the client cancels; streaming responses are returned as an async iterable, read only as fast as
 * the call sends them.
 */
export type ServiceImpl<S extends DescService> = {
  [K in keyof Methods<S>]: HandlerFor<Methods<S>[K] & MethodShape>;
};

/** Per-call options on the client side. */
export interface CallOptions {
  /** Relative timeout; combined with the ambient request deadline, the earliest wins. */
  timeoutMs?: number;
  /** Absolute deadline in epoch milliseconds. */
  deadlineMs?: number;
  metadata?: Record<string, string>;
  signal?: AbortSignal;
}

export type ClientMethodFor<M extends MethodShape> = M['methodKind'] extends 'unary'
  ? (request: MessageInitShape<M['input']>, options?: CallOptions) => Promise<MessageShape<M['output']>>
  : M['methodKind'] extends 'server_streaming'
    ? (request: MessageInitShape<M['input']>, options?: CallOptions) => AsyncIterable<MessageShape<M['output']>>
    : M['methodKind'] extends 'client_streaming'
      ? (
          requests: AsyncIterable<MessageInitShape<M['input']>>,
          options?: CallOptions,
        ) => Promise<MessageShape<M['output']>>
      : never;

/** A typed client of a generated service. */
export type ServiceClient<S extends DescService> = {
  [K in keyof Methods<S>]: ClientMethodFor<Methods<S>[K] & MethodShape>;
} & {
  /** Closes the channel. */
  close(): void;
  /**
   * Starts connecting now (resolving the target, the TCP and TLS handshakes) instead of on the first
   * call, so that a first call bounded by a short deadline does not spend it there.
   */
  connect(): void;
};
