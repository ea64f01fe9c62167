export * from './rpc-error';
export * from './service-definition';
export * from './method-types';
export * from './grpc-server';
export * from './grpc-client';
export * from './health';
export * from './deadline';
export * from './transport-security';
