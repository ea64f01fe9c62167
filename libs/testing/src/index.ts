export * from './redis-server';
export * from './free-port';
