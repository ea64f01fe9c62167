import { status } from '@grpc/grpc-js';
import { Inject, Injectable } from '@nestjs/common';
import { RpcError } from '@infermesh/grpc';
import { createHash, timingSafeEqual } from 'node:crypto';
import { GATEWAY_CONFIG, type GatewayConfig } from './gateway.config';

const sha256 = (value: string) => createHash('sha256').update(value, 'utf8').digest();

/**
 * Checks `Authorization: Bearer <key>` against the configured keys. Keys are compared as SHA-256
 * digests with timingSafeEqual, every key every time, so neither the length nor the position of a
 * match shows in the timing. Keys are never logged or echoed.
 */
@Injectable()
export class ApiKeyAuth {
  private readonly digests: Buffer[];

  constructor(@Inject(GATEWAY_CONFIG) config: Pick<GatewayConfig, 'apiKeys'>) {
    this.digests = config.apiKeys.map(sha256);
  }

  /** Throws UNAUTHENTICATED unless the header carries an accepted key. */
  verify(authorization: string | undefined): void {
    if (authorization === undefined || authorization === '') {
      throw unauthenticated('missing API key: send "Authorization: Bearer <key>"');
    }
    const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization);
    if (match === null) throw unauthenticated('malformed Authorization header: expected "Bearer <key>"');
    const presented = sha256(match[1]!);
    let accepted = false;
    for (const digest of this.digests) accepted = timingSafeEqual(digest, presented) || accepted;
    if (!accepted) throw unauthenticated('invalid API key');
  }
}

function unauthenticated(message: string): RpcError {
  return new RpcError(status.UNAUTHENTICATED, message, { reason: 'UNAUTHENTICATED' });
}
