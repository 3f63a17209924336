<?php
// A proxy to chime (argv[1], host:port) that forwards every request, but drops the
// connection of the first `POST /api/v1/tasks` after chime answered it, without passing the
// answer on: a network failure after the server stored the task. Prints its port, then
// one line per forwarded create ("forwarded" or "dropped").
// With argv[2] = "unavailable", the first create is answered 503 as chime does without its
// database, and not forwarded.
$target = $argv[1];
$unavailable = ($argv[2] ?? '') === 'unavailable';
$server = stream_socket_server('tcp://127.0.0.1:0', $errno, $error) or die("proxy: $error\n");
$name = stream_socket_get_name($server, false);
echo substr($name, strrpos($name, ':') + 1), "\n";
$dropped = false;
while ($conn = @stream_socket_accept($server, -1)) {
    $head = '';
    while (!str_contains($head, "\r\n\r\n") && ($line = fgets($conn)) !== false) {
        $head .= $line;
    }
    [$requestLine] = explode("\r\n", $head, 2);
    [$method, $path] = explode(' ', $requestLine);
    $length = preg_match('/^Content-Length:\s*(\d+)/mi', $head, $m) ? (int) $m[1] : 0;
    $body = $length > 0 ? stream_get_contents($conn, $length) : '';
    if ($unavailable && !$dropped && $method === 'POST' && $path === '/api/v1/tasks') {
        $dropped = true;
        echo "unavailable\n";
        $answer = '{"error": {"code": "unavailable", "message": "the database is unavailable; retry shortly"}}';
        fwrite($conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " . strlen($answer) . "\r\nConnection: close\r\n\r\n" . $answer);
        fclose($conn);
        continue;
    }
    $headers = [];
    foreach (array_slice(explode("\r\n", trim($head)), 1) as $h) {
        if (!preg_match('/^(host|connection|content-length|expect):/i', $h)) {
            $headers[] = $h;
        }
    }
    $curl = curl_init("http://$target$path");
    curl_setopt_array($curl, [CURLOPT_CUSTOMREQUEST => $method, CURLOPT_RETURNTRANSFER => true, CURLOPT_HTTPHEADER => $headers]);
    if ($body !== '') {
        curl_setopt($curl, CURLOPT_POSTFIELDS, $body);
    }
    $answer = curl_exec($curl);
    $status = curl_getinfo($curl, CURLINFO_RESPONSE_CODE);
    if ($method === 'POST' && $path === '/api/v1/tasks') {
        if (!$dropped) {
            $dropped = true;
            echo "dropped\n";
            fclose($conn);
            continue;
        }
        echo "forwarded\n";
    }
    fwrite($conn, "HTTP/1.1 $status X\r\nContent-Type: application/json\r\nContent-Length: " . strlen($answer) . "\r\nConnection: close\r\n\r\n" . $answer);
    fclose($conn);
}
