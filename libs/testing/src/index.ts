export * from './redis-server';
export * from './free-port';
export * from './rpc-rejection';
export * from './fake-registry';
export * from './xds-probe';
export * from './eventually';
export * from './thrown';
export * from './relative-l2';
