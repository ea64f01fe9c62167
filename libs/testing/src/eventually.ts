// eventually and deferred live in libs/clock (see waiting.testing.ts there), so that libs/grpc's specs
// can use them too.
export { type Deferred, deferred, eventually } from '@infermesh/clock/waiting.testing';
