export * from './registry-watch';
export * from './registry-watch.provider';
