import { status } from '@grpc/grpc-js';
import { ApiKeyAuth } from './api-key-auth';

describe(ApiKeyAuth.name, () => {
  const sut = new ApiKeyAuth({ apiKeys: ['first-key', 'second-key'] });

  it.each(['Bearer first-key', 'Bearer second-key', 'bearer first-key', 'Bearer  first-key '])('accepts %j', (header) => {
    expect(() => sut.verify(header)).not.toThrow();
  });

  it.each([
    ['no header', undefined, /missing API key/],
    ['an empty header', '', /missing API key/],
    ['another scheme', 'Basic first-key', /malformed/],
    ['a bare key', 'first-key', /malformed/],
    ['a wrong key', 'Bearer third-key', /invalid API key/],
    ['a prefix of a key', 'Bearer first', /invalid API key/],
    ['a key with extra characters', 'Bearer first-key2', /invalid API key/],
  ])('refuses %s with UNAUTHENTICATED, never echoing the key', (_label, header, message) => {
    let error: unknown;
    try {
      sut.verify(header);
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({ code: status.UNAUTHENTICATED, reason: 'UNAUTHENTICATED', message: expect.stringMatching(message) });
    expect((error as Error).message).not.toContain('first-key');
  });
});
