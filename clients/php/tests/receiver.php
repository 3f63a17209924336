<?php
// A real receiver, run by `php -S` as its router: each callback's headers and body are
// written to a file in CHIME_RECEIVER_DIR, and it answers 200.
$dir = getenv('CHIME_RECEIVER_DIR');
$body = file_get_contents('php://input');
$call = [
    'signature' => $_SERVER['HTTP_CHIME_SIGNATURE'] ?? null,
    'task_id' => $_SERVER['HTTP_CHIME_TASK_ID'] ?? null,
    'body' => base64_encode($body),
];
file_put_contents($dir . '/' . uniqid('call-', true) . '.json', json_encode($call));
http_response_code(200);
echo 'ok';
