export * from './rate-limiter';
export * from './rate-limiter.memory';
export * from './rate-limiter.redis';
export * from './rate-limiter.fallback';
