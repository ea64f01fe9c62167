export * from './quantize-dynamic';
