import { Inject, Injectable } from '@nestjs/common';
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
 */
@Injectable()
export class BodyBudget {
  private inFlight = 0;
  private readonly refusals: Counter;

  constructor(
    @Inject(GATEWAY_CONFIG) private readonly config: Pick<GatewayConfig, 'maxBodyBytesInFlight'>,
    metrics: Metrics,
  ) {
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
