'use strict';
// Test fixture: the execution thread, except that a run whose first input is named "crash" ends the
// thread at once, before its session sees the run, as a thread that dies would. Its listener is
// registered before the execution thread's own, so that one never receives that run.
const { parentPort } = require('node:worker_threads');

parentPort.on('message', (message) => {
  if (message.type === 'run' && message.feeds[0] && message.feeds[0].name === 'crash') process.exit(70);
});
require('./execution-thread.js');
