export * from './clock';
export * from './overdue-sweep';
