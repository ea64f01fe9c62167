import { Inject, Injectable, type OnModuleDestroy } from '@nestjs/common';
import { Clock, OverdueSweep } from '@infermesh/clock';
import { Errors } from '@infermesh/grpc';
import { Metrics } from '@infermesh/telemetry';
import type { Counter } from 'prom-client';
import { GATEWAY_CONFIG, type GatewayConfig } from '../gateway.config';

/** How long a client refused for the body budget is told to wait. */
const RETRY_AFTER_MS = 1_000;

/** Bytes taken from the budget; `release` gives them back, once, however often it is called. */
export interface BodyReservation {
  /** Takes `bytes` more for the same request; throws RESOURCE_EXHAUSTED (and takes none) when they do not fit. */
  grow(bytes: number): void;
  release(): void;
}

/**
 * The gateway's budget of request-body bytes held at once, across all requests, REST and gRPC
 * (GATEWAY_MAX_BODY_BYTES_IN_FLIGHT): each connection may send up to GATEWAY_MAX_BODY_BYTES, but
 * not all of them at once. A REST body is counted as it arrives (all of it at once when its
 * Content-Length says how large it will be), a gRPC request by the size of its message, and given
 * back when the request is answered. A request that does not fit is refused at once with
 * RESOURCE_EXHAUSTED (429) and a retry delay, instead of being buffered.
 *
 * A REST body read whole must have arrived within GATEWAY_HTTP_RECEIVE_TIMEOUT_MS of when its reading
 * began (watchArrival), else its request is refused 408: a client that sends headers and a body it
 * never finishes would otherwise hold its share of the budget, and the handler waiting for it, for as
 * long as Node lets a request take (5 minutes). Streamed bodies (artifact uploads) are not bound by it.
 */
@Injectable()
export class BodyBudget implements OnModuleDestroy {
  private inFlight = 0;
  private readonly refusals: Counter;
  private readonly arriving: OverdueSweep<object>;

  constructor(
    @Inject(GATEWAY_CONFIG)
    private readonly config: Pick<GatewayConfig, 'maxBodyBytesInFlight'> & {
      http: Pick<GatewayConfig['http'], 'receiveTimeoutMs'>;
    },
    metrics: Metrics,
    clock: Clock,
  ) {
    this.arriving = new OverdueSweep(clock, config.http.receiveTimeoutMs);
    metrics.gauge(
      'request_body_bytes_in_flight',
      'Request body bytes the gateway holds at once (limit: GATEWAY_MAX_BODY_BYTES_IN_FLIGHT).',
      [],
      (gauge) => gauge.set(this.inFlight),
    );
    this.refusals = metrics.counter(
      'request_body_budget_refusals_total',
      'Requests refused because their body did not fit GATEWAY_MAX_BODY_BYTES_IN_FLIGHT.',
    );
  }

  onModuleDestroy(): void {
    this.arriving.close();
  }

  /**
   * Watches a body being read: unless the returned function is called first (its last byte came, or
   * its request ended otherwise), `onOverdue` is called with the error to refuse it with once the
   * receive timeout has passed.
   */
  watchArrival(body: object, onOverdue: (error: Error) => void): () => void {
    const timeoutMs = this.arriving.timeoutMs;
    this.arriving.watch(body, () =>
      onOverdue(
        Errors.bodyTimeout(
          `the request body did not arrive whole within ${timeoutMs} ms (GATEWAY_HTTP_RECEIVE_TIMEOUT_MS)`,
          { metadata: { limit: 'GATEWAY_HTTP_RECEIVE_TIMEOUT_MS' } },
        ),
      ),
    );
    return () => this.arriving.forget(body);
  }

  /** Bytes held now. */
  get bytesInFlight(): number {
    return this.inFlight;
  }

  /** Takes `bytes` (0 for a body of unknown size, grown as it arrives); throws RESOURCE_EXHAUSTED when they do not fit. */
  reserve(bytes: number): BodyReservation {
    this.take(bytes);
    let held = bytes;
    let released = false;
    return {
      grow: (more: number) => {
        if (released) return;
        this.take(more);
        held += more;
      },
      release: () => {
        if (released) return;
        released = true;
        this.inFlight -= held;
      },
    };
  }

  private take(bytes: number): void {
    const limit = this.config.maxBodyBytesInFlight;
    if (bytes > 0 && this.inFlight + bytes > limit) {
      this.refusals.inc();
      throw Errors.overloaded(
        `the gateway holds ${this.inFlight} bytes of request bodies and this one (${bytes} more bytes) would pass its limit of ${limit} bytes in flight (GATEWAY_MAX_BODY_BYTES_IN_FLIGHT); retry later`,
        { retryDelayMs: RETRY_AFTER_MS, metadata: { limit: 'GATEWAY_MAX_BODY_BYTES_IN_FLIGHT' } },
      );
    }
    this.inFlight += bytes;
  }
}
